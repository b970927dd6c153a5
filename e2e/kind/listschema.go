// Package kind brings up a kind cluster without kube-proxy and follows docs/kind.md
// against it (kind_test.go), and holds what other tests share with it: the JSON schema
// of `nftproxy list -o json` (docs/schema/list-v1.json) and its validation.
package kind

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ListSchemaID is the $id of docs/schema/list-v1.json.
const ListSchemaID = "https://github.com/nftproxy/nftproxy/docs/schema/list-v1.json"

// RepoRoot is the repository's top directory (found from this file's path).
func RepoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

// ListSchema compiles docs/schema/list-v1.json with format assertions on (addresses
// must be IP addresses, not merely strings).
func ListSchema() (*jsonschema.Schema, error) {
	f, err := os.Open(filepath.Join(RepoRoot(), "docs", "schema", "list-v1.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("docs/schema/list-v1.json: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(ListSchemaID, doc); err != nil {
		return nil, err
	}
	return c.Compile(ListSchemaID)
}

// ValidateList checks the output of `nftproxy list -o json` against the schema.
func ValidateList(s *jsonschema.Schema, out []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(inst)
}
