package bench

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"slices"
	"strings"
)

// Chart draws the results as log-scale bar charts (cold start, one-change latencies),
// with the standard library only: a 3×5 pixel font scaled up.
func (r *Results) Chart() ([]byte, error) {
	var ns []Size // N × endpoints per service
	var proxies []string
	for _, run := range r.Runs {
		if z := (Size{run.N, run.Endpoints}); !slices.Contains(ns, z) {
			ns = append(ns, z)
		}
		if !slices.Contains(proxies, run.Proxy) {
			proxies = append(proxies, run.Proxy)
		}
	}
	slices.SortFunc(ns, func(a, b Size) int {
		if a.N != b.N {
			return a.N - b.N
		}
		return a.Endpoints - b.Endpoints
	})
	get := func(proxy string, z Size) *Run {
		for _, run := range r.Runs {
			if run.Proxy == proxy && run.N == z.N && run.Endpoints == z.Endpoints {
				return run
			}
		}
		return nil
	}
	type bar struct {
		v        float64 // in the panel's unit; 0: none
		atLeast  bool    // did not finish: v is the bound
		skipped  bool
		label    string
		proxyIdx int
	}
	type panel struct {
		title  string
		unit   string
		bars   [][]bar // per N, per proxy
		format func(float64) string
	}
	mk := func(title, unit string, format func(float64) string, f func(*Run) (float64, bool, bool)) panel {
		p := panel{title: title, unit: unit, format: format}
		for _, n := range ns {
			var row []bar
			for pi, name := range proxies {
				run := get(name, n)
				b := bar{proxyIdx: pi}
				if run == nil {
					b.skipped = true
				} else if run.Skipped != "" {
					b.skipped = true
					b.label = "SKIP"
				} else {
					v, atLeast, ok := f(run)
					if ok {
						b.v, b.atLeast = v, atLeast
					}
				}
				row = append(row, b)
			}
			p.bars = append(p.bars, row)
		}
		return p
	}
	fmtS := func(v float64) string {
		if v < 1 {
			return fmt.Sprintf("%.0fMS", v*1000)
		}
		if v < 100 {
			return fmt.Sprintf("%.1fS", v)
		}
		return fmt.Sprintf("%.0fS", v)
	}
	fmtMS := func(v float64) string {
		if v < 10 {
			return fmt.Sprintf("%.1fMS", v)
		}
		if v < 10000 {
			return fmt.Sprintf("%.0fMS", v)
		}
		return fmt.Sprintf("%.0fS", v/1000)
	}
	panels := []panel{
		mk("COLD START: ALL SAMPLED SERVICES ANSWER", "SECONDS", fmtS, func(run *Run) (float64, bool, bool) {
			cs := run.ColdStart
			if cs == nil {
				return 0, false, false
			}
			if cs.TimedOut {
				return cs.BoundSeconds, true, true
			}
			return cs.AllProgrammed, false, cs.AllProgrammed > 0
		}),
		mk("ONE ADDED SERVICE: WRITE TO PACKETS, P50", "MILLISECONDS", fmtMS, func(run *Run) (float64, bool, bool) {
			v, ok := latP50(run.AddService)
			return v, false, ok
		}),
		mk("ONE ENDPOINT CHANGE: WRITE TO PACKETS, P50", "MILLISECONDS", fmtMS, func(run *Run) (float64, bool, bool) {
			v, ok := latP50(run.EndpointChange)
			return v, false, ok
		}),
	}

	const (
		pw, ph   = 560, 470 // panel size
		top      = 70       // title and legend
		marginL  = 70
		marginB  = 50
		marginT  = 40
		width    = pw * 3
		height   = ph + top
		fontBig  = 2
		fontTiny = 1
	)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	colors := []color.RGBA{{46, 139, 87, 255}, {65, 105, 225, 255}, {230, 126, 34, 255}, {128, 128, 128, 255}}
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{220, 220, 220, 255}

	drawText(img, 10, 10, fontBig+1, black, "NFTPROXY VS KUBE-PROXY "+strings.ToUpper(r.Host.KubeProxy)+" - LOG SCALE, LOWER IS BETTER")
	x := 10
	for i, name := range proxies {
		c := colors[min(i, len(colors)-1)]
		fill(img, image.Rect(x, 40, x+16, 52), c)
		drawText(img, x+22, 41, fontBig, black, strings.ToUpper(name))
		x += 22 + textWidth(strings.ToUpper(name), fontBig) + 30
	}
	drawText(img, x, 41, fontBig, black, "N = SERVICES X ENDPOINTS EACH; HATCHED = DID NOT FINISH")

	for pi, p := range panels {
		ox, oy := pi*pw, top
		plot := image.Rect(ox+marginL, oy+marginT, ox+pw-15, oy+ph-marginB)
		drawText(img, ox+marginL, oy+8, fontBig, black, p.title)
		// log range: whole decades around the values
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, row := range p.bars {
			for _, b := range row {
				if b.v > 0 {
					lo, hi = math.Min(lo, b.v), math.Max(hi, b.v)
				}
			}
		}
		if math.IsInf(lo, 1) {
			drawText(img, plot.Min.X+10, plot.Min.Y+20, fontBig, black, "NO DATA")
			continue
		}
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		yOf := func(v float64) int {
			f := (math.Log10(v) - dlo) / (dhi - dlo)
			return plot.Max.Y - int(f*float64(plot.Dy()))
		}
		for d := dlo; d <= dhi; d++ {
			y := yOf(math.Pow(10, d))
			fill(img, image.Rect(plot.Min.X, y, plot.Max.X, y+1), grey)
			lbl := p.format(math.Pow(10, d))
			drawText(img, plot.Min.X-6-textWidth(lbl, fontBig), y-5, fontBig, black, lbl)
		}
		fill(img, image.Rect(plot.Min.X, plot.Min.Y, plot.Min.X+1, plot.Max.Y), black)
		fill(img, image.Rect(plot.Min.X, plot.Max.Y, plot.Max.X, plot.Max.Y+1), black)
		groupW := plot.Dx() / max(1, len(ns))
		barW := max(4, (groupW-16)/max(1, len(proxies)))
		for gi, row := range p.bars {
			gx := plot.Min.X + gi*groupW + 8
			for bi, b := range row {
				bx := gx + bi*barW
				c := colors[min(b.proxyIdx, len(colors)-1)]
				if b.v > 0 {
					y := yOf(b.v)
					rect := image.Rect(bx+1, y, bx+barW-1, plot.Max.Y)
					if b.atLeast {
						hatch(img, rect, c)
					} else {
						fill(img, rect, c)
					}
					lbl := p.format(b.v)
					if b.atLeast {
						lbl = ">" + lbl
					}
					drawText(img, bx+barW/2-textWidth(lbl, fontTiny)/2, y-8, fontTiny, black, lbl)
				} else if b.label != "" {
					drawText(img, bx+barW/2-textWidth(b.label, fontTiny)/2, plot.Max.Y-8, fontTiny, black, b.label)
				}
			}
			nl := fmt.Sprintf("N=%d", ns[gi].N)
			if e := ns[gi].Endpoints; e != 0 && e != r.Options.Endpoints {
				nl += fmt.Sprintf("X%d", e)
			}
			drawText(img, gx+(groupW-16)/2-textWidth(nl, fontBig)/2, plot.Max.Y+8, fontBig, black, nl)
		}
		drawText(img, ox+marginL, oy+ph-20, fontBig, black, p.unit)
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func hatch(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if (x+y)%6 < 3 || x == r.Min.X || x == r.Max.X-1 || y == r.Min.Y {
				img.SetRGBA(x, y, c)
			}
		}
	}
}

// font3x5 is a 3×5 pixel font: five rows of three columns, '#' set.
var font3x5 = map[rune]string{
	'0': "###,#.#,#.#,#.#,###", '1': ".#.,##.,.#.,.#.,###", '2': "###,..#,###,#..,###",
	'3': "###,..#,.##,..#,###", '4': "#.#,#.#,###,..#,..#", '5': "###,#..,###,..#,###",
	'6': "###,#..,###,#.#,###", '7': "###,..#,.#.,.#.,.#.", '8': "###,#.#,###,#.#,###",
	'9': "###,#.#,###,..#,###",
	'A': ".#.,#.#,###,#.#,#.#", 'B': "##.,#.#,##.,#.#,##.", 'C': ".##,#..,#..,#..,.##",
	'D': "##.,#.#,#.#,#.#,##.", 'E': "###,#..,##.,#..,###", 'F': "###,#..,##.,#..,#..",
	'G': ".##,#..,#.#,#.#,.##", 'H': "#.#,#.#,###,#.#,#.#", 'I': "###,.#.,.#.,.#.,###",
	'J': "..#,..#,..#,#.#,.#.", 'K': "#.#,#.#,##.,#.#,#.#", 'L': "#..,#..,#..,#..,###",
	'M': "#.#,###,###,#.#,#.#", 'N': "##.,#.#,#.#,#.#,#.#", 'O': ".#.,#.#,#.#,#.#,.#.",
	'P': "##.,#.#,##.,#..,#..", 'Q': ".#.,#.#,#.#,##.,.##", 'R': "##.,#.#,##.,#.#,#.#",
	'S': ".##,#..,.#.,..#,##.", 'T': "###,.#.,.#.,.#.,.#.", 'U': "#.#,#.#,#.#,#.#,###",
	'V': "#.#,#.#,#.#,#.#,.#.", 'W': "#.#,#.#,###,###,#.#", 'X': "#.#,#.#,.#.,#.#,#.#",
	'Y': "#.#,#.#,.#.,.#.,.#.", 'Z': "###,..#,.#.,#..,###",
	' ': "...,...,...,...,...", '.': "...,...,...,...,.#.", '-': "...,...,###,...,...",
	':': "...,.#.,...,.#.,...", '/': "..#,..#,.#.,#..,#..", '>': "#..,.#.,..#,.#.,#..",
	'=': "...,###,...,###,...", ',': "...,...,...,.#.,#..", ';': "...,.#.,...,.#.,#..",
	'(': ".#.,#..,#..,#..,.#.", ')': ".#.,..#,..#,..#,.#.", '%': "#.#,..#,.#.,#..,#.#",
	'+': "...,.#.,###,.#.,...",
}

func textWidth(s string, scale int) int { return len([]rune(s)) * 4 * scale }

func drawText(img *image.RGBA, x, y, scale int, c color.RGBA, s string) {
	for _, ch := range strings.ToUpper(s) {
		g, ok := font3x5[ch]
		if !ok {
			g = font3x5['-']
		}
		for row, bits := range strings.Split(g, ",") {
			for col, b := range bits {
				if b == '#' {
					fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
		x += 4 * scale
	}
}
