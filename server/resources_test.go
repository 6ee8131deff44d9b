package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Large output files come back as resource links that resources/read
// serves and resources/list lists; small ones inline; any of them is a
// file into a later call as files[].uri, without its bytes passing
// through the client.
func TestOutputFilesAsResources(t *testing.T) {
	o := testOptions()
	o.TextBytes = 4096
	_, cs := connect(t, newFakeEngine(), o, nil)
	if cs.InitializeResult().Capabilities.Resources == nil {
		t.Errorf("the server does not advertise resources")
	}
	out, res := call(t, cs, map[string]any{"code": "files:small.txt=100,big.csv=5000,fig.png=10000,huge.png=2000000,raw.bin=100"})
	want := []string{"*mcp.TextContent", "*mcp.EmbeddedResource", "*mcp.ResourceLink", "*mcp.ImageContent", "*mcp.ResourceLink", "*mcp.EmbeddedResource"}
	var got []string
	for _, c := range res.Content {
		got = append(got, fmt.Sprintf("%T", c))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("content blocks %v, want %v", got, want)
	}
	for _, line := range []string{"  small.txt (100 bytes): below\n", "  big.csv (5000 bytes): resource_link " + out.Files[1].URI + "\n",
		"  fig.png (10000 bytes): image below\n", "  huge.png (2000000 bytes): resource_link " + out.Files[3].URI + "\n", "resources/read"} {
		if !strings.Contains(text(res), line) {
			t.Errorf("text lacks %q:\n%s", line, text(res))
		}
	}
	for i, name := range []string{"big.csv", "huge.png"} {
		link := res.Content[2+2*i].(*mcp.ResourceLink)
		if link.URI != out.Files[1+2*i].URI || link.Name != name || *link.Size != out.Files[1+2*i].Size || link.MIMEType != out.Files[1+2*i].MIMEType {
			t.Errorf("link %+v, want the file's uri, name, size and type (%+v)", link, out.Files[1+2*i])
		}
		read, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link.URI})
		if err != nil {
			t.Fatalf("resources/read %s: %v", name, err)
		}
		data := []byte(read.Contents[0].Text)
		if read.Contents[0].Blob != nil {
			data = read.Contents[0].Blob
		}
		if !bytes.Equal(data, fakeFile(name, int(*link.Size))) {
			t.Errorf("resources/read %s: %d bytes, not the file's", name, len(data))
		}
	}
	list, err := cs.ListResources(context.Background(), nil)
	if err != nil || len(list.Resources) != 5 || list.Resources[1].URI != out.Files[1].URI || list.Resources[1].Size != 5000 {
		t.Errorf("resources/list = %+v, %v; want the call's 5 files", list, err)
	}
	// Into the next call by uri.
	again, _ := call(t, cs, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "in/huge.png", "uri": out.Files[3].URI}}})
	if len(again.Files) != 2 || again.Files[0].Path != "in/huge.png" || again.Files[0].Size != 2000000 {
		t.Errorf("a file in by uri came back as %+v", again.Files)
	}
}

// A client's resources are its own: another client's resources/read,
// files[].uri and resources/list find nothing of them, as for a URI that
// never was.
func TestResourcesAreTheClients(t *testing.T) {
	s, a := connect(t, newFakeEngine(), testOptions(), nil)
	b := clientAs(t, s, "b")
	out, _ := call(t, a, map[string]any{"code": "files:big.csv=100000"})
	uri := out.Files[0].URI
	own, err := a.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatalf("the client's own resource: %v", err)
	}
	// Its own, and no intermediary's to keep for another.
	if own.CacheScope != "private" {
		t.Errorf("resources/read: cacheScope %q, want private", own.CacheScope)
	}
	if _, err := b.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "Resource not found") {
		t.Errorf("another client's resources/read: %v, want not found", err)
	}
	if msg := callErr(t, b, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "x", "uri": uri}}}); !strings.HasPrefix(msg, "files[0].uri: ") ||
		!strings.Contains(msg, "not an output file this client was given") {
		t.Errorf("another client's files[].uri: %q", msg)
	}
	if list, err := b.ListResources(context.Background(), nil); err != nil || len(list.Resources) != 0 {
		t.Errorf("another client's resources/list: %+v, %v; want none", list, err)
	}
	for _, bad := range []string{resourcePrefix + strings.Repeat("0", 32) + "/big.csv", strings.Replace(uri, "big.csv", "other.csv", 1), "file:///etc/passwd"} {
		if msg := callErr(t, a, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "x", "uri": bad}}}); !strings.HasPrefix(msg, "files[0].uri: ") {
			t.Errorf("files[].uri %q: %q", bad, msg)
		}
	}
}

// Over streamable HTTP a client is its HTTP session: its resources are
// read across its requests, never by another session. In stateless HTTP
// no client is known: the URI alone gives access, and nothing is listed.
func TestResourcesOverHTTP(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			o := testOptions()
			o.Transport, o.AuthToken, o.Stateless = HTTP, testToken, stateless
			a, b := httpPair(t, o)
			out, _ := call(t, a, map[string]any{"code": "files:big.csv=100000"})
			uri := out.Files[0].URI
			if _, err := a.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri}); err != nil {
				t.Errorf("its own resource: %v", err)
			}
			_, err := b.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
			if !stateless && err == nil || stateless && err != nil {
				t.Errorf("another client's read: %v", err)
			}
			for _, cs := range []*mcp.ClientSession{a, b} {
				list, err := cs.ListResources(context.Background(), nil)
				if err != nil || stateless && len(list.Resources) != 0 {
					t.Errorf("resources/list: %+v, %v; want nothing listed where no client is known", list, err)
				}
			}
		})
	}
}

// httpPair serves s over streamable HTTP and connects two clients.
func httpPair(t *testing.T, o Options) (*mcp.ClientSession, *mcp.ClientSession) {
	s, err := New(newFakeEngine(), o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeHTTP(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	var clients [2]*mcp.ClientSession
	for i := range clients {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + "/mcp", HTTPClient: &http.Client{Transport: bearer{}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		clients[i] = cs
	}
	return clients[0], clients[1]
}

// A resource lives ResourceTTL: after it, its client hears that it
// expired; another client still hears nothing of it.
func TestResourcesExpire(t *testing.T) {
	s, a := connect(t, newFakeEngine(), testOptions(), nil)
	b := clientAs(t, s, "b")
	var mu sync.Mutex
	now := time.Now()
	s.store.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	out, _ := call(t, a, map[string]any{"code": "files:big.csv=100000"})
	uri := out.Files[0].URI
	mu.Lock()
	now = now.Add(s.opts.ResourceTTL)
	mu.Unlock()
	if _, err := a.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "MCP_EXEC_RESOURCE_TTL_S") {
		t.Errorf("resources/read after the TTL: %v, want expired", err)
	}
	if msg := callErr(t, a, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "x", "uri": uri}}}); !strings.Contains(msg, "files[0].uri: that output file has expired") {
		t.Errorf("files[].uri after the TTL: %q", msg)
	}
	if msg := callErr(t, b, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "x", "uri": uri}}}); strings.Contains(msg, "expired") {
		t.Errorf("another client's files[].uri after the TTL: %q, want nothing said of it", msg)
	}
	if list, _ := a.ListResources(context.Background(), nil); len(list.Resources) != 0 {
		t.Errorf("resources/list after the TTL: %d resources", len(list.Resources))
	}
	if s.store.bytes != 0 {
		t.Errorf("the store holds %d bytes after the TTL", s.store.bytes)
	}
}

// The store's bounds: a client holds at most half of it (its own oldest
// go first), all clients at most all of it (the oldest go first), in
// bytes and in count; a file over a client's share is not kept.
func TestResourceStoreBounds(t *testing.T) {
	st := newResourceStore(100, time.Hour)
	a, b, c := &mcp.ServerSession{}, &mcp.ServerSession{}, &mcp.ServerSession{}
	st.scopes[a], st.scopes[b], st.scopes[c] = &scopeUse{}, &scopeUse{}, &scopeUse{} // no watcher: these sessions never end
	held := func(s *mcp.ServerSession) (n int64) {
		for _, r := range st.order {
			if r.scope == s {
				n += int64(len(r.data))
			}
		}
		return n
	}
	b1 := st.put(b, "b1", "", make([]byte, 40))
	for i := range 5 {
		if st.put(a, fmt.Sprint("a", i), "", make([]byte, 20)) == "" {
			t.Fatalf("a's file %d not kept", i)
		}
	}
	if held(a) != 40 || held(b) != 40 {
		t.Errorf("a holds %d, b %d; want a at its share (40: its oldest went) and b's untouched", held(a), held(b))
	}
	if _, err := st.get(b, b1); err != nil {
		t.Errorf("b's file after a's: %v", err)
	}
	if st.put(a, "too big", "", make([]byte, 51)) != "" {
		t.Errorf("a file over a client's share was kept")
	}
	st.put(c, "c1", "", make([]byte, 50))
	if st.bytes > 100 || held(c) != 50 {
		t.Errorf("the store holds %d bytes (c %d), want at most 100 and c's file", st.bytes, held(c))
	}
	// Empty files cost an entry each: a client holds half of them, all
	// of them are bounded too.
	for _, s := range []*mcp.ServerSession{a, b, c} {
		for range maxResources {
			st.put(s, "empty", "", nil)
		}
	}
	if n := len(st.order); n > maxResources || st.scopes[a].count > maxResources/2 || st.scopes[c].count != maxResources/2 {
		t.Errorf("%d resources held, a %d, c %d; want at most %d, a at most %d, c (the newest) %[5]d", n, st.scopes[a].count, st.scopes[c].count, maxResources, maxResources/2)
	}
}

// A client's resources go when its connection does.
func TestResourcesGoWithTheClient(t *testing.T) {
	s, a := connect(t, newFakeEngine(), testOptions(), nil)
	b := clientAs(t, s, "b")
	call(t, a, map[string]any{"code": "files:a.csv=1000"})
	call(t, b, map[string]any{"code": "files:b.csv=1000"})
	b.Close()
	waitFor(t, "b's resources to go", func() bool {
		s.store.mu.Lock()
		defer s.store.mu.Unlock()
		return len(s.store.order) == 1 && s.store.bytes == 1000
	})
	if list, _ := a.ListResources(context.Background(), nil); len(list.Resources) != 1 {
		t.Errorf("a's resources after b left: %+v", list)
	}
}

// With no store every file comes inline, as before, and files[].uri is
// refused naming the variable.
func TestResourcesOff(t *testing.T) {
	o := testOptions()
	o.ResourceMaxBytes, o.TextBytes = 0, 4096
	_, cs := connect(t, newFakeEngine(), o, nil)
	out, res := call(t, cs, map[string]any{"code": "files:big.csv=100000,huge.png=2000000"})
	if out.Files[0].URI != "" || len(res.Content) != 3 {
		t.Errorf("no store: files %+v, %d blocks; want no uri and every file inline", out.Files, len(res.Content))
	}
	if _, ok := res.Content[1].(*mcp.EmbeddedResource); !ok {
		t.Errorf("no store: %T, want the file inline", res.Content[1])
	}
	if msg := callErr(t, cs, map[string]any{"code": "echofiles", "files": []any{map[string]any{"path": "x", "uri": resourcePrefix + "x/y"}}}); !strings.Contains(msg, "MCP_EXEC_RESOURCE_MAX_MB=0") {
		t.Errorf("files[].uri with no store: %q", msg)
	}
}
