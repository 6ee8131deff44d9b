package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServeStdio serves MCP on in and out, one JSON-RPC message per line, until
// in reaches EOF or ctx is done; then it kills the running calls and
// returns once they are torn down.
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	return s.Serve(ctx, stdioTransport(in, out, int(min(maxMessageBytes(s.opts), math.MaxInt32)), s.log), "stdio")
}

// Serve serves one MCP session on t until it ends or ctx is done; then it
// kills the running calls and returns once they are torn down. client
// names the peer in the audit log, and is the one client its persistent
// sessions count against.
func (s *Server) Serve(ctx context.Context, t mcp.Transport, client string) error {
	s.serving(ctx)
	defer s.drain()
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: client} })
	return srv.Run(ctx, t)
}

// stdioTransport is the SDK's newline-delimited JSON transport behind a
// filter. The SDK ends a stdio session at the first line it cannot decode
// (malformed JSON, a message that is not JSON-RPC, a line over its limit, a
// bad batch); a client's mistake must get an error response and leave the
// server serving, so the filter answers such lines itself and passes on
// only well-formed single messages.
func stdioTransport(in io.Reader, out io.Writer, maxLine int, log *slog.Logger) mcp.Transport {
	pr, pw := io.Pipe()
	w := &lockedWriter{w: out}
	go func() {
		err := filterLines(in, pw, w, maxLine, log)
		// EOF on stdin reaches the SDK as EOF: the session ends and its
		// calls are cancelled.
		pw.CloseWithError(err)
	}()
	// The filter already bounds every line it passes on.
	return &mcp.IOTransport{Reader: pr, Writer: nopWriteCloser{w}, MaxLineLength: -1}
}

// lockedWriter keeps the filter's error responses and the SDK's messages
// whole: both write one complete line per Write.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// filterLines copies valid JSON-RPC messages from src to dst, one per line,
// and answers every other non-blank line on reply with a JSON-RPC error.
// It returns nil at EOF.
func filterLines(src io.Reader, dst io.Writer, reply io.Writer, maxLine int, log *slog.Logger) error {
	r := bufio.NewReaderSize(src, 64<<10)
	for {
		line, size, err := readLine(r, maxLine)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) > 0 {
			if code, msg := checkLine(line, size, maxLine); code != 0 {
				log.Warn("rejecting a stdio message", "bytes", size, "code", code, "reason", msg)
				if _, werr := reply.Write(errorResponse(requestID(line), code, msg)); werr != nil {
					return werr
				}
			} else if _, werr := dst.Write(append(line, '\n')); werr != nil {
				return werr
			}
		}
		if err != nil {
			return nil
		}
	}
}

// readLine reads one line. Of a line longer than max it keeps only the
// first 4 KiB, enough to find its id, and returns its full size.
func readLine(r *bufio.Reader, max int) (line []byte, size int, err error) {
	const keep = 4 << 10
	for {
		chunk, err := r.ReadSlice('\n')
		size += len(chunk)
		switch {
		case size <= max:
			line = append(line, chunk...)
		case len(line) < keep:
			line = append(line, chunk[:min(len(chunk), keep-len(line))]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, size, err
	}
}

// checkLine returns a JSON-RPC error code and message for a line the SDK
// would choke on, or 0.
func checkLine(line []byte, size, maxLine int) (int64, string) {
	if size > maxLine {
		return jsonrpc.CodeInvalidRequest, fmt.Sprintf("message is %d bytes, over the limit of %d bytes (set by MCP_EXEC_MAX_CODE_BYTES, MCP_EXEC_MAX_STDIN_BYTES and MCP_EXEC_MAX_FILE_BYTES)", size, maxLine)
	}
	if !json.Valid(line) {
		return jsonrpc.CodeParseError, "parse error: the line is not valid JSON"
	}
	if line[0] == '[' {
		// Batches left the protocol in 2025-06-18, and the SDK ends the
		// session on a malformed one.
		return jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported; send one message per line"
	}
	if _, err := jsonrpc.DecodeMessage(line); err != nil {
		return jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid JSON-RPC message: %v", err)
	}
	return 0, ""
}

// requestID finds the id of a rejected message so that its sender gets the
// error rather than waiting: from a whole message, or from the start of one
// cut off by the line limit when "id" comes before the large params.
func requestID(line []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(line))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if key == "id" {
			// JSON-RPC ids are strings or numbers.
			if len(v) > 0 && (v[0] == '"' || v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
				return v
			}
			return nil
		}
	}
	return nil
}

// errorResponse is a JSON-RPC error line; its id is null when unknown, as
// JSON-RPC requires.
func errorResponse(id json.RawMessage, code int64, msg string) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	return append(b, '\n')
}
