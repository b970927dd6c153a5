package kind

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Block is one fenced code block of a Markdown page that the kind e2e runs.
type Block struct {
	Line int    // line of the opening fence, 1-based
	Code string // the lines between the fences
}

// ShellBlocks returns the page's fenced blocks whose info string is exactly "sh", in
// order: docs/kind.md marks the commands the e2e runs that way (alternatives are
// "shell" blocks). An unclosed fence is an error.
func ShellBlocks(page []byte) ([]Block, error) {
	var out []Block
	var cur *Block
	var code strings.Builder
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(page))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence == "" {
			if strings.HasPrefix(trimmed, "```") {
				fence = "```"
				if strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == "sh" {
					cur = &Block{Line: n}
					code.Reset()
				}
			}
			continue
		}
		if trimmed == fence {
			if cur != nil {
				cur.Code = code.String()
				out = append(out, *cur)
				cur = nil
			}
			fence = ""
			continue
		}
		if cur != nil {
			code.WriteString(line)
			code.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("unclosed code block")
	}
	return out, nil
}

// PageBlocks reads docs/kind.md's sh blocks.
func PageBlocks() ([]Block, error) {
	page, err := os.ReadFile(RepoRoot() + "/docs/kind.md")
	if err != nil {
		return nil, err
	}
	return ShellBlocks(page)
}
