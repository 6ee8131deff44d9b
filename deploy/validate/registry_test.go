package validate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const (
	schemaPath   = "testdata/server.schema.json"
	schemaSHA256 = "d4c163f299ece68b7432f4e44c4108f2fdb663d99dc088c8344142e5b0a4b520"
	schemaURL    = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
	serverJSON   = "../../server.json"
	iconPath     = "../icon.svg"
)

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != schemaSHA256 {
		t.Fatalf("%s: sha256 %x, want the pinned %s (see testdata/README.md)", schemaPath, sum, schemaSHA256)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(schemaURL, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		t.Fatalf("compiling the registry schema: %v", err)
	}
	return s
}

func readJSON(t *testing.T, path string) any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func TestServerJSONMatchesRegistrySchema(t *testing.T) {
	s := compileSchema(t)
	doc := readJSON(t, serverJSON)
	if err := s.Validate(doc); err != nil {
		t.Fatalf("server.json against the registry schema: %v", err)
	}

	// The schema must be able to refuse: each of these breaks a rule of it.
	for _, tc := range []struct {
		name   string
		mutate func(m map[string]any)
	}{
		{"name without a namespace", func(m map[string]any) { m["name"] = "mcp-exec" }},
		{"description over 100 characters", func(m map[string]any) { m["description"] = strings.Repeat("x", 101) }},
		{"no version", func(m map[string]any) { delete(m, "version") }},
		{"package without transport", func(m map[string]any) { delete(pkg(m), "transport") }},
		{"icon of an unknown type", func(m map[string]any) {
			m["icons"].([]any)[0].(map[string]any)["mimeType"] = "image/x-icon"
		}},
	} {
		bad := readJSON(t, serverJSON).(map[string]any)
		tc.mutate(bad)
		if err := s.Validate(bad); err == nil {
			t.Errorf("server.json with a %s: the schema accepted it", tc.name)
		}
	}
}

func pkg(m map[string]any) map[string]any { return m["packages"].([]any)[0].(map[string]any) }

// TestServerJSONContents checks what the schema cannot: the image, the
// transport, the locked-down docker flags of mcp-exec 0.5.4 and the
// environment variables.
func TestServerJSONContents(t *testing.T) {
	var doc struct {
		Schema   string `json:"$schema"`
		Name     string `json:"name"`
		Version  string `json:"version"`
		Icons    []struct{ Src, MimeType string }
		Packages []struct {
			RegistryType, Identifier, RuntimeHint string
			RuntimeArguments                      []struct{ Type, Value string }
			Transport                             struct{ Type string }
			EnvironmentVariables                  []struct {
				Name, Description, Value, Default string
				IsSecret                          bool
			}
		}
	}
	data, err := os.ReadFile(serverJSON)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Schema != schemaURL {
		t.Errorf("$schema = %q, want %q (the vendored schema)", doc.Schema, schemaURL)
	}
	if len(doc.Packages) != 1 {
		t.Fatalf("packages: %d, want 1", len(doc.Packages))
	}
	p := doc.Packages[0]
	if p.RegistryType != "oci" || p.Identifier != "docker.io/idconstruct/mcp-exec:"+doc.Version || p.Transport.Type != "stdio" || p.RuntimeHint != "docker" {
		t.Errorf("package = %s %s (%s, %s), want oci docker.io/idconstruct/mcp-exec:%s over stdio with docker",
			p.RegistryType, p.Identifier, p.Transport.Type, p.RuntimeHint, doc.Version)
	}
	var flags []string
	for _, a := range p.RuntimeArguments {
		flags = append(flags, a.Value)
	}
	want := "--network=none --read-only --cap-drop=ALL --security-opt=no-new-privileges --user=65532:65532 " +
		"--tmpfs=/tmp:rw,noexec,nosuid,size=64m --memory=256m --pids-limit=128 --cpus=1"
	if got := strings.Join(flags, " "); got != want {
		t.Errorf("runtimeArguments = %s\nwant the 0.5.4 entry's flags %s", got, want)
	}
	seen := map[string]bool{}
	for _, e := range p.EnvironmentVariables {
		if !strings.HasPrefix(e.Name, "MCP_EXEC_") || e.Description == "" || seen[e.Name] {
			t.Errorf("environment variable %q: want a described, unique MCP_EXEC_ name", e.Name)
		}
		seen[e.Name] = true
		if secret := e.Name == "MCP_EXEC_AUTH_TOKEN"; e.IsSecret != secret {
			t.Errorf("%s: isSecret = %v, want %v", e.Name, e.IsSecret, secret)
		}
	}
	for _, name := range []string{"MCP_EXEC_TRANSPORT", "MCP_EXEC_RUNTIME", "MCP_EXEC_AUTH_TOKEN", "MCP_EXEC_MEMORY_MB", "MCP_EXEC_DEFAULT_TIMEOUT_S"} {
		if !seen[name] {
			t.Errorf("environmentVariables lacks %s", name)
		}
	}
	if len(doc.Icons) != 1 || !strings.HasSuffix(doc.Icons[0].Src, "/deploy/icon.svg") || doc.Icons[0].MimeType != "image/svg+xml" {
		t.Errorf("icons = %+v, want deploy/icon.svg as image/svg+xml", doc.Icons)
	}
}

// TestIcon parses the icon as XML and holds it to what MCP clients are
// told to be wary of in SVG: no script, no external reference, small.
func TestIcon(t *testing.T) {
	data, err := os.ReadFile(iconPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) >= 2048 {
		t.Errorf("icon.svg is %d bytes, want < 2048", len(data))
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	var root *xml.StartElement
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("icon.svg is not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == nil {
			root = &se
		}
		if se.Name.Local == "script" || se.Name.Local == "foreignObject" {
			t.Errorf("icon.svg has a <%s>", se.Name.Local)
		}
		for _, a := range se.Attr {
			if a.Name.Local == "href" || strings.HasPrefix(a.Name.Local, "on") {
				t.Errorf("icon.svg: <%s %s=%q>: no references or handlers", se.Name.Local, a.Name.Local, a.Value)
			}
		}
	}
	if root == nil || root.Name.Local != "svg" || root.Name.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("icon.svg: root element %v, want svg in the SVG namespace", root)
	}
	viewBox := ""
	for _, a := range root.Attr {
		if a.Name.Local == "viewBox" {
			viewBox = a.Value
		}
	}
	if viewBox != "0 0 64 64" {
		t.Errorf("icon.svg viewBox = %q, want \"0 0 64 64\" (square, scalable)", viewBox)
	}
}
