package server

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/inhuman/mcp-exec/internal/names"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Arguments by name. The inputSchema says additionalProperties: false, and
// the SDK would refuse an unknown argument in its own words
// ("validating root: unexpected additional properties") before the
// handler runs, with no record of the call. A model that wrote "timeout"
// for "timeout_s" needs to hear which name it meant; an operator needs the
// refusal in the audit log and the metrics like any other. So a receiving
// middleware looks at the names before the SDK validates: it takes the
// unknown ones out of the arguments and leaves the refusal, naming them and
// the closest known names, in the context, where the handler finds it and
// refuses the call as it refuses any invalid input.

// fileFields are what a files[] item may hold.
var fileFields = []string{"path", "content", "content_base64", "uri"}

type badArgumentsKey struct{}

// badArguments is the refusal checkArguments left for the call, or nil.
func badArguments(ctx context.Context) error {
	err, _ := ctx.Value(badArgumentsKey{}).(error)
	return err
}

// checkArguments is the middleware that checks the exec tool's argument
// names against known (the inputSchema's properties).
func checkArguments(known []string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || method != "tools/call" || call.Params == nil || call.Params.Name != "exec" {
				return next(ctx, method, req)
			}
			kept, err := unknownArguments(call.Params.Arguments, known)
			if err != nil {
				call.Params.Arguments = kept
				ctx = context.WithValue(ctx, badArgumentsKey{}, err)
			}
			return next(ctx, method, req)
		}
	}
}

// unknownArguments says which names of args (a JSON object) are unknown,
// at the top or in a files[] item, and returns args without them. args
// that are no object are the SDK's to refuse.
func unknownArguments(args json.RawMessage, known []string) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil || m == nil {
		return args, nil
	}
	var msgs []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(known, name) {
			msgs = append(msgs, unknownName("argument", name, known))
			delete(m, name)
		}
	}
	if len(msgs) > 0 {
		msgs[len(msgs)-1] += fmt.Sprintf(" (exec takes %s)", strings.Join(known, ", "))
	}
	var files []map[string]json.RawMessage
	if json.Unmarshal(m["files"], &files) == nil {
		for i, f := range files {
			for _, name := range slices.Sorted(maps.Keys(f)) {
				if !slices.Contains(fileFields, name) {
					msgs = append(msgs, fmt.Sprintf("files[%d]: %s (a file has path and one of content, content_base64 or uri)", i, unknownName("field", name, fileFields)))
					delete(m, "files") // refused anyway; the rest of it need not pass the schema
				}
			}
		}
	}
	if len(msgs) == 0 {
		return args, nil
	}
	kept, err := json.Marshal(m)
	if err != nil {
		return args, nil
	}
	return kept, &inputError{fmt.Errorf("%s", strings.Join(msgs, "; "))}
}

// unknownName says that name is unknown and, when one of known is close,
// that it was probably meant: `unknown argument "timeout"; did you mean
// "timeout_s"?`.
func unknownName(what, name string, known []string) string {
	msg := fmt.Sprintf("unknown %s %q", what, clip(name, 64))
	if m := closest(name, known); m != "" {
		msg += fmt.Sprintf("; did you mean %q?", m)
	}
	return msg
}

// closest is the known name name was most likely meant to be: within an
// edit distance of a third of its length (at least 2), or one a prefix of
// the other (of 3 characters or more); "" when none is.
func closest(name string, known []string) string {
	lower := strings.ToLower(name)
	best, bestD := "", -1
	for _, k := range known {
		d := names.Distance(lower, k)
		close := d <= max(2, len(k)/3) ||
			(len(lower) >= 3 && (strings.HasPrefix(k, lower) || strings.HasPrefix(lower, k)))
		if close && (bestD < 0 || d < bestD) {
			best, bestD = k, d
		}
	}
	return best
}

// schemaProperties are the names an object schema's properties has, in
// order.
func schemaProperties(schema any) []string {
	m, _ := schema.(map[string]any)
	props, _ := m["properties"].(map[string]any)
	return slices.Sorted(maps.Keys(props))
}
