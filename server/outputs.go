package server

import (
	"encoding/base64"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/runtime"
)

// How a call's output files come back. Each is kept in the resource store
// (when there is one) and gets a uri there. It comes inline, as a content
// block, when it is small: an image of at most inlineImageBytes while the
// call's inlined images stay within inlineImagesBytes; any other file
// while the call's other inlined files stay within TextBytes (a binary one
// counted as its base64), as a model reads them like the text block.
// Larger, it comes as a resource_link to its uri. A file the store cannot
// keep comes inline whatever its size: nothing is dropped.
const (
	inlineImageBytes  = 1 << 20
	inlineImagesBytes = 4 << 20
)

// fileBlocks are the content blocks of a call's files, whose entries in
// out get their uri; shown says how each came back (callText.shown).
func (s *Server) fileBlocks(files []runtime.File, out *execOutput, scope *mcp.ServerSession) (blocks []mcp.Content, shown []string) {
	shown = make([]string, len(files))
	var images, others int64
	for i, f := range files {
		of := &out.Files[i]
		of.URI = s.store.put(scope, f.Path, of.MIMEType, f.Data)
		size := int64(len(f.Data))
		cost := inlineCost(f.Data)
		switch {
		case imageTypes[of.MIMEType] && size <= inlineImageBytes && images+size <= inlineImagesBytes:
			images += size
			shown[i] = "image below"
		case !imageTypes[of.MIMEType] && others+cost <= int64(s.opts.textBytes()):
			others += cost
			shown[i] = "below"
		case of.URI != "":
			blocks = append(blocks, &mcp.ResourceLink{URI: of.URI, Name: f.Path, MIMEType: of.MIMEType, Size: &size,
				Description: "an output file of the exec call: read it with resources/read, or pass this uri in files[].uri"})
			shown[i] = "link"
			continue
		default:
			shown[i] = "below"
		}
		blocks = append(blocks, fileContent(f, of.MIMEType))
	}
	return blocks, shown
}

// inlineCost is what a file inlined as a resource weighs: its text, or
// its base64.
func inlineCost(data []byte) int64 {
	if textual(data) {
		return int64(len(data))
	}
	return int64(base64.StdEncoding.EncodedLen(len(data)))
}
