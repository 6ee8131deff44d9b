package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Output files as resources. Every file a call returns is kept for a while
// in a bounded store in the server's memory, under a URI of 128 random
// bits; one too large to inline comes back as a resource_link to it, which
// resources/read serves, and any of them can be handed to a later call as
// files[].uri without passing through the model.
//
// A resource is its client's: the MCP session that made the call (the
// stdio peer, an HTTP session, a legacy SSE stream). Another client's
// resources/read or files[].uri of it is told there is no such resource,
// as for one that never was. In stateless HTTP, where no request names a
// client, the URI is the whole of the access control (as a session handle
// is) and nothing is listed.
//
// Bounds: a resource lives ResourceTTL after the call that made it; the
// store holds at most ResourceMaxBytes and maxResources of them, a client
// at most half of each (its own oldest go first when it needs room); when
// the store is full, the oldest go first, whoever's.

// resourcePrefix starts every resource URI of this server.
const resourcePrefix = "mcp-exec://outputs/"

// resourceTemplate is the shape of a resource URI: the id, then the path
// the file had under /tmp/outputs, escaped.
const resourceTemplate = resourcePrefix + "{id}/{+path}"

// maxResources bounds how many resources the store holds (empty files
// cost no bytes but an entry each); rememberExpired how many expired ones
// it remembers, to tell their client they expired.
const (
	maxResources    = 4096
	rememberExpired = 4096
)

// resource is one output file in the store.
type resource struct {
	id, uri, path, mime string
	data                []byte
	// scope is the client that may read it; nil: whoever has the URI.
	scope   *mcp.ServerSession
	expires time.Time
}

// resourceStore holds the output files of calls for a while.
type resourceStore struct {
	ttl      time.Duration
	maxBytes int64
	now      func() time.Time // test seam

	mu      sync.Mutex
	byID    map[string]*resource
	order   []*resource // oldest first
	bytes   int64
	scopes  map[*mcp.ServerSession]*scopeUse
	expired map[string]*mcp.ServerSession // id → its scope, for a while
	gone    []string                      // expired ids, oldest first
	sweep   *time.Timer
}

// scopeUse is what one client holds.
type scopeUse struct {
	bytes int64
	count int
}

// newResourceStore returns a store, or nil (no store: files are inlined)
// when maxBytes is 0.
func newResourceStore(maxBytes int64, ttl time.Duration) *resourceStore {
	if maxBytes <= 0 {
		return nil
	}
	return &resourceStore{ttl: ttl, maxBytes: maxBytes, now: time.Now, byID: map[string]*resource{},
		scopes: map[*mcp.ServerSession]*scopeUse{}, expired: map[string]*mcp.ServerSession{}}
}

// put keeps a file for scope and returns its URI, or "" when there is no
// store or the file is larger than a client's share of it.
func (st *resourceStore) put(scope *mcp.ServerSession, path, mime string, data []byte) string {
	if st == nil || int64(len(data)) > st.share(scope, st.maxBytes) {
		return ""
	}
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	r := &resource{id: hex.EncodeToString(b[:]), path: path, mime: mime, data: data, scope: scope}
	r.uri = resourcePrefix + r.id + "/" + escapePath(path)
	st.mu.Lock()
	defer st.mu.Unlock()
	now := st.now()
	r.expires = now.Add(st.ttl)
	st.expire(now)
	st.makeRoom(scope, int64(len(data)))
	st.byID[r.id] = r
	st.order = append(st.order, r)
	st.bytes += int64(len(data))
	if scope != nil {
		u := st.scopes[scope]
		if u == nil {
			u = &scopeUse{}
			st.scopes[scope] = u
			go st.dropWhenGone(scope)
		}
		u.bytes += int64(len(data))
		u.count++
	}
	if st.sweep == nil {
		st.sweep = time.AfterFunc(st.ttl, st.sweepExpired)
	}
	return r.uri
}

// share is a client's part of a bound: half of it (all of it where no
// client is known).
func (st *resourceStore) share(scope *mcp.ServerSession, bound int64) int64 {
	if scope == nil {
		return bound
	}
	return max(bound/2, 1)
}

// makeRoom drops resources until size more bytes and one more resource
// fit: scope's own oldest while it is over its share, then the oldest of
// all. st.mu is held.
func (st *resourceStore) makeRoom(scope *mcp.ServerSession, size int64) {
	if u := st.scopes[scope]; u != nil {
		for u.bytes+size > st.share(scope, st.maxBytes) || int64(u.count+1) > st.share(scope, maxResources) {
			st.drop(st.oldestOf(scope))
		}
	}
	for st.bytes+size > st.maxBytes || len(st.order)+1 > maxResources {
		st.drop(st.order[0])
	}
}

func (st *resourceStore) oldestOf(scope *mcp.ServerSession) *resource {
	for _, r := range st.order {
		if r.scope == scope {
			return r
		}
	}
	return nil
}

// drop removes r from the store. st.mu is held.
func (st *resourceStore) drop(r *resource) {
	delete(st.byID, r.id)
	for i, o := range st.order {
		if o == r {
			st.order = append(st.order[:i], st.order[i+1:]...)
			break
		}
	}
	st.bytes -= int64(len(r.data))
	if u := st.scopes[r.scope]; u != nil {
		u.bytes -= int64(len(r.data))
		u.count--
	}
}

// expire drops the resources past their time, remembering whose they
// were. st.mu is held.
func (st *resourceStore) expire(now time.Time) {
	for len(st.order) > 0 && !now.Before(st.order[0].expires) {
		r := st.order[0]
		st.drop(r)
		st.expired[r.id] = r.scope
		st.gone = append(st.gone, r.id)
		if len(st.gone) > rememberExpired {
			delete(st.expired, st.gone[0])
			st.gone = st.gone[1:]
		}
	}
}

// sweepExpired frees what has expired, and comes back when the next
// resource does.
func (st *resourceStore) sweepExpired() {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := st.now()
	st.expire(now)
	st.sweep = nil
	if len(st.order) > 0 {
		st.sweep = time.AfterFunc(st.order[0].expires.Sub(now), st.sweepExpired)
	}
}

// dropWhenGone drops a client's resources once its MCP session has ended:
// nobody may read them any more.
func (st *resourceStore) dropWhenGone(scope *mcp.ServerSession) {
	scope.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, r := range append([]*resource(nil), st.order...) {
		if r.scope == scope {
			st.drop(r)
		}
	}
	delete(st.scopes, scope)
}

// errNoResource is what a client is told of a URI that is not one of its
// live resources: never whether it is another client's.
var errNoResource = errors.New("no such resource")

// get returns scope's resource at uri; errResourceExpired when it was
// scope's and has expired, else errNoResource.
func (st *resourceStore) get(scope *mcp.ServerSession, uri string) (*resource, error) {
	id, _, _ := strings.Cut(strings.TrimPrefix(uri, resourcePrefix), "/")
	if st == nil || !strings.HasPrefix(uri, resourcePrefix) {
		return nil, errNoResource
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.expire(st.now())
	if r, ok := st.byID[id]; ok && r.uri == uri && r.scope == scope {
		return r, nil
	}
	if s, ok := st.expired[id]; ok && s == scope {
		return nil, errResourceExpired
	}
	return nil, errNoResource
}

var errResourceExpired = errors.New("resource expired")

// list is scope's live resources, oldest first.
func (st *resourceStore) list(scope *mcp.ServerSession) []*mcp.Resource {
	out := []*mcp.Resource{}
	if st == nil || scope == nil {
		return out
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.expire(st.now())
	for _, r := range st.order {
		if r.scope == scope {
			size := int64(len(r.data))
			out = append(out, &mcp.Resource{URI: r.uri, Name: r.path, MIMEType: r.mime, Size: size})
		}
	}
	return out
}

// scopeOf is the client a request's resources belong to: its MCP
// session, or nil in stateless HTTP, where each request has a session of
// its own and no client is known.
func (s *Server) scopeOf(ss *mcp.ServerSession) *mcp.ServerSession {
	if s.opts.Transport == HTTP && s.opts.Stateless {
		return nil
	}
	return ss
}

// readResource serves resources/read of an output file.
func (s *Server) readResource(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	r, err := s.store.get(s.scopeOf(req.Session), uri)
	switch {
	case errors.Is(err, errResourceExpired):
		return nil, &jsonrpc.Error{Code: mcp.CodeResourceNotFound, Message: fmt.Sprintf(
			"resource expired: output files are kept %s s after their call (MCP_EXEC_RESOURCE_TTL_S)", fmtSeconds(s.opts.ResourceTTL))}
	case err != nil:
		return nil, mcp.ResourceNotFoundError(uri)
	}
	c := &mcp.ResourceContents{URI: r.uri, MIMEType: r.mime}
	if textual(r.data) && len(r.data) > 0 {
		c.Text = string(r.data)
	} else {
		c.Blob = r.data
		if c.Blob == nil {
			c.Blob = []byte{}
		}
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}

// listResources answers resources/list with the caller's live output
// files; other methods pass on.
func (s *Server) listResources(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "resources/list" {
			return next(ctx, method, req)
		}
		ss, _ := req.GetSession().(*mcp.ServerSession)
		return &mcp.ListResourcesResult{Resources: s.store.list(s.scopeOf(ss))}, nil
	}
}

// uriFile is the data of files[i].uri: an output file scope was given.
func (s *Server) uriFile(i int, uri string, scope *mcp.ServerSession) ([]byte, error) {
	if s.store == nil {
		return nil, fmt.Errorf("files[%d].uri: output files are not kept on this server (MCP_EXEC_RESOURCE_MAX_MB=0): send the file's content", i)
	}
	r, err := s.store.get(scope, uri)
	switch {
	case errors.Is(err, errResourceExpired):
		return nil, fmt.Errorf("files[%d].uri: that output file has expired: they are kept %s s after their call (MCP_EXEC_RESOURCE_TTL_S); make it again", i, fmtSeconds(s.opts.ResourceTTL))
	case err != nil:
		// Not the uri itself: the message is logged, and in stateless HTTP
		// a uri is all it takes to read its file.
		return nil, fmt.Errorf("files[%d].uri: not an output file this client was given: give the uri of a resource_link (or files[].uri) of an earlier result of this connection, within %s s of it (MCP_EXEC_RESOURCE_TTL_S)",
			i, fmtSeconds(s.opts.ResourceTTL))
	}
	return r.data, nil
}
