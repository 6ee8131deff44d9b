package server

import (
	"encoding/base64"
	"fmt"
	"mime"
	"net/http"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// inputFile is one of the exec tool's input files: a path relative to
// /tmp and its content, as text or as base64.
type inputFile struct {
	Path          string  `json:"path"`
	Content       *string `json:"content,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
	// URI names an output file of an earlier call of the same client
	// (resources.go).
	URI *string `json:"uri,omitempty"`
}

// outputFile describes a file returned from /tmp/outputs.
type outputFile struct {
	Path     string `json:"path" jsonschema:"path relative to /tmp/outputs"`
	Size     int64  `json:"size" jsonschema:"size in bytes"`
	MIMEType string `json:"mime_type" jsonschema:"media type, from the name or the content"`
	URI      string `json:"uri,omitempty" jsonschema:"the file as a resource of this server, kept for a while: readable with resources/read, and usable as files[].uri in a later call, by this client only; empty when the server keeps no files"`
}

// leftOutFile is an output that did not come back.
type leftOutFile struct {
	Path string `json:"path" jsonschema:"path relative to /tmp/outputs; a directory's ends in /"`
	Size int64  `json:"size" jsonschema:"size in bytes (0 for a directory)"`
	Why  string `json:"why" jsonschema:"count (past the file count limit), bytes (past the byte limit of the call's files), unreadable, or limits (past the bounds of the walk: depth, entries, path length)"`
}

// filesSchema is the input schema of files. The limits are in its
// description, not in maxItems: the handler's own check names the variable
// that sets them, the SDK's schema error would not.
func filesSchema(o Options) map[string]any {
	return map[string]any{
		"type": "array",
		"description": fmt.Sprintf("files written under %s (the working directory) before the code starts; at most %d files and %d bytes in all. "+
			"Leave files to return in %s.", policy.WorkDir, o.MaxFiles, o.MaxFileBytes, policy.OutputsDir),
		"items": map[string]any{
			"type":                 "object",
			"required":             []string{"path"},
			"additionalProperties": false,
			"properties": map[string]any{
				"path":           map[string]any{"type": "string", "description": "relative to " + policy.WorkDir + "; no '..', not absolute"},
				"content":        map[string]any{"type": "string", "description": "the file's text (UTF-8)"},
				"content_base64": map[string]any{"type": "string", "description": "the file's bytes, base64-encoded (instead of content)"},
				"uri":            map[string]any{"type": "string", "description": "instead of content: the uri of an output file an earlier result of this connection returned (a resource_link, or files[].uri)"},
			},
		},
	}
}

// validateFiles decodes the input files and checks them against the
// limits; every message names files.
// withoutDots drops the "." elements of a path ("./data.csv",
// "a/./b"), as clients write them; ".." and the rest stay for the check.
func withoutDots(p string) string {
	if !strings.Contains(p, ".") {
		return p
	}
	elems := strings.Split(p, "/")
	kept := elems[:0]
	for i, e := range elems {
		if e == "." && (i > 0 || len(elems) > 1) {
			continue
		}
		kept = append(kept, e)
	}
	if len(kept) == 0 {
		return p
	}
	return strings.Join(kept, "/")
}

func (s *Server) validateFiles(in []inputFile, scope *mcp.ServerSession) ([]runtime.File, error) {
	if len(in) > s.opts.MaxFiles {
		return nil, fmt.Errorf("files: %d files, over the limit of %d (MCP_EXEC_MAX_FILES)", len(in), s.opts.MaxFiles)
	}
	var total int64
	seen := map[string]bool{}
	out := make([]runtime.File, 0, len(in))
	for i, f := range in {
		clean := withoutDots(f.Path)
		if err := runtime.CheckRelPath(clean); err != nil {
			return nil, fmt.Errorf("files[%d].path %q: %v", i, f.Path, err)
		}
		if clean == policy.OutputsName || strings.HasPrefix(clean, policy.OutputsName+"/") {
			return nil, fmt.Errorf("files[%d].path %q: %s starts empty in every call; put input files elsewhere", i, f.Path, policy.OutputsDir)
		}
		if seen[clean] {
			return nil, fmt.Errorf("files[%d].path %q: given twice", i, f.Path)
		}
		seen[clean] = true
		var data []byte
		switch {
		case (f.Content != nil) && (f.ContentBase64 != nil) || (f.Content != nil || f.ContentBase64 != nil) && f.URI != nil:
			return nil, fmt.Errorf("files[%d]: give one of content, content_base64 or uri", i)
		case f.URI != nil:
			var err error
			if data, err = s.uriFile(i, *f.URI, scope); err != nil {
				return nil, err
			}
		case f.Content != nil:
			data = []byte(*f.Content)
		case f.ContentBase64 != nil:
			var err error
			if data, err = base64.StdEncoding.DecodeString(*f.ContentBase64); err != nil {
				return nil, fmt.Errorf("files[%d].content_base64: %v", i, err)
			}
		default:
			return nil, fmt.Errorf("files[%d]: content, content_base64 or uri is required", i)
		}
		total += int64(len(data))
		if total > s.opts.MaxFileBytes {
			return nil, fmt.Errorf("files: more than %d bytes in all, over the limit (MCP_EXEC_MAX_FILE_BYTES)", s.opts.MaxFileBytes)
		}
		out = append(out, runtime.File{Path: clean, Data: data})
	}
	// A file cannot also be a directory of another.
	for p := range seen {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if seen[d] {
				return nil, fmt.Errorf("files: %q is a file and a directory of %q", d, p)
			}
		}
	}
	return out, nil
}

// imageTypes are returned as MCP image blocks.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// mimeType guesses a file's media type from its name, else its content.
// An image block is only ever what the content is: a file named as an
// image that is not one (HTML named x.png) gets its content's type, and
// comes back as a resource; a PNG named x.jpg comes back as a PNG.
func mimeType(name string, data []byte) string {
	sniffed, _, _ := strings.Cut(http.DetectContentType(data), ";")
	t, _, _ := strings.Cut(mime.TypeByExtension(path.Ext(name)), ";")
	if imageTypes[t] || imageTypes[sniffed] || t == "" {
		return sniffed
	}
	return t
}

// fileContent is the content block of a returned file: an image block for
// an image, else an embedded resource, as text when it is UTF-8.
func fileContent(f runtime.File, typ string) mcp.Content {
	if imageTypes[typ] {
		return &mcp.ImageContent{Data: f.Data, MIMEType: typ}
	}
	rc := &mcp.ResourceContents{URI: "file://" + policy.OutputsDir + "/" + escapePath(f.Path), MIMEType: typ}
	if textual(f.Data) {
		rc.Text = string(f.Data)
		if len(f.Data) == 0 {
			// An empty text would vanish from the wire (omitempty): an
			// empty blob says the same and survives.
			rc.Blob = []byte{}
		}
	} else {
		rc.Blob = f.Data
	}
	return &mcp.EmbeddedResource{Resource: rc}
}

// textual says whether data comes back as text: UTF-8 without NUL.
func textual(data []byte) bool {
	return utf8.Valid(data) && !strings.ContainsRune(string(data), 0)
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = strings.ReplaceAll(urlPathEscape(s), "+", "%2B")
	}
	return strings.Join(parts, "/")
}

func urlPathEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
