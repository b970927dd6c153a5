package kind

import (
	"os/exec"
	"strings"
	"testing"
)

func TestShellBlocks(t *testing.T) {
	page := "intro\n```sh\necho a\n\necho b\n```\n```shell\nnot run\n```\n````\n```sh\nin a quote\n````\n```yaml\nx: 1\n```\n  ```sh\n  indented\n  ```\n"
	got, err := ShellBlocks([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Code != "echo a\n\necho b\n" || got[0].Line != 2 || got[1].Code != "  indented\n" {
		t.Fatalf("blocks: %+v", got)
	}
	if _, err := ShellBlocks([]byte("```sh\necho\n")); err == nil {
		t.Fatal("an unclosed block was accepted")
	}
}

// docs/kind.md as the e2e runs it: the steps it relies on are there, in order, and
// every block is valid bash. Cheap: it runs with `make test`, the cluster does not.
func TestPageBlocks(t *testing.T) {
	blocks, err := PageBlocks()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"cat > kind-nftproxy.yaml", "kubeProxyMode: none", "restrict_oom_score_adj", "failCgroupV1: false",
		"kind create cluster --config kind-nftproxy.yaml", "nf_conntrack_tcp_be_liberal=1",
		"make release", "kind load image-archive", "kind get kubeconfig --internal", "kubectl apply -f -",
		"rollout status daemonset/nftproxy", "nftproxy verify", "nft list ruleset",
		"kubectl create deployment web", "--command -- /agnhost pause", "curl", "nftproxy list -o json", "jq -e",
		"kind delete cluster --name nftproxy",
	}
	all := ""
	for _, b := range blocks {
		all += b.Code
		if out, err := exec.Command("bash", "-n", "-c", b.Code).CombinedOutput(); err != nil {
			t.Errorf("docs/kind.md:%d: not valid bash: %v\n%s", b.Line, err, out)
		}
	}
	at := 0
	for _, w := range want {
		i := strings.Index(all[at:], w)
		if i < 0 {
			t.Errorf("docs/kind.md: no %q after offset %d of its sh blocks", w, at)
			continue
		}
		at += i
	}
	if strings.Contains(all, "docker cp") {
		t.Error("docs/kind.md runs docker cp: a node's /tmp is a tmpfs that hides what it writes")
	}
	if last := blocks[len(blocks)-1].Code; !strings.HasPrefix(last, "kind delete cluster") {
		t.Errorf("the last sh block is not the cluster's deletion (the e2e checks before it): %q", last)
	}
}
