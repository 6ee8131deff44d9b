// Package nettest serves, on the test machine's loopback, what the tests
// of the network allowlist reach through a sandbox: HTTPS hosts whose
// certificates come from a CA of the test's own (as a private mirror's
// would), a PEP 503 package index holding wheels the test builds (one of
// pure Python, one with a C extension), an API that answers only with a
// bearer token, and servers that keep a connection open to see when it is
// closed. No test here reaches the internet.
package nettest

import (
	"archive/zip"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// CA is a test's own certificate authority for the hosts it serves.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "mcp-exec test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue makes a server certificate for names.
func (ca *CA) Issue(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// PEM is the CA's certificate.
func (ca *CA) PEM() []byte { return ca.pem }

// Pool is a pool that trusts the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// File writes the CA's certificate where MCP_EXEC_EGRESS_CA_FILE can
// name it.
func (ca *CA) File(t testing.TB) string {
	t.Helper()
	return WriteFile(t, "ca.pem", ca.pem, 0o644)
}

// WriteFile writes data in a temp dir of the test's, with exactly mode.
func WriteFile(t testing.TB, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

// ServeHTTPS serves h over TLS on 127.0.0.1 with a certificate ca issues
// for names; it returns the port.
func ServeHTTPS(t testing.TB, ca *CA, h http.Handler, names ...string) int {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	// Tunnels the tests refuse or cut end handshakes half way: not news.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, names...)}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.Listener.Addr().(*net.TCPAddr).Port
}

// ServeHTTP serves h over plain HTTP on 127.0.0.1; it returns the port.
func ServeHTTP(t testing.TB, h http.Handler) int {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.Listener.Addr().(*net.TCPAddr).Port
}

// Index is a PEP 503 simple index: /simple/<project>/ lists its files,
// /files/<file> serves one.
type Index struct {
	mu       sync.Mutex
	projects map[string][]string
	files    map[string][]byte
	Served   atomic.Int32
}

func NewIndex() *Index { return &Index{projects: map[string][]string{}, files: map[string][]byte{}} }

// Add puts a file of project in the index.
func (ix *Index) Add(project, file string, data []byte) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.projects[project] = append(ix.projects[project], file)
	ix.files[file] = data
}

func (ix *Index) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ix.Served.Add(1)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if project, ok := strings.CutPrefix(r.URL.Path, "/simple/"); ok {
		files, ok := ix.projects[strings.TrimSuffix(project, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<!DOCTYPE html><html><body>\n")
		for _, f := range files {
			sum := sha256.Sum256(ix.files[f])
			fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", f, hex.EncodeToString(sum[:]), f)
		}
		io.WriteString(w, "</body></html>\n")
		return
	}
	if f, ok := strings.CutPrefix(r.URL.Path, "/files/"); ok {
		if data, ok := ix.files[f]; ok {
			w.Write(data)
			return
		}
	}
	http.NotFound(w, r)
}

// wheel zips files as a wheel of name and version with tag: its METADATA,
// WHEEL and RECORD made here.
func wheel(t testing.TB, name, version, tag string, purelib bool, files map[string][]byte) ([]byte, string) {
	t.Helper()
	distInfo := fmt.Sprintf("%s-%s.dist-info", name, version)
	all := map[string][]byte{}
	for p, b := range files {
		all[p] = b
	}
	all[distInfo+"/METADATA"] = fmt.Appendf(nil, "Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(name, "_", "-"), version)
	all[distInfo+"/WHEEL"] = fmt.Appendf(nil, "Wheel-Version: 1.0\nGenerator: mcp-exec-test\nRoot-Is-Purelib: %v\nTag: %s\n", purelib, tag)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for p, b := range all {
		w, err := zw.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
		sum := sha256.Sum256(b)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", p, base64.RawURLEncoding.EncodeToString(sum[:]), len(b))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", distInfo)
	w, _ := zw.Create(distInfo + "/RECORD")
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), fmt.Sprintf("%s-%s-%s.whl", name, version, tag)
}

// PureWheel is a wheel of one pure-Python package, name, whose
// __init__.py is source.
func PureWheel(t testing.TB, name, version, source string) ([]byte, string) {
	t.Helper()
	return wheel(t, name, version, "py3-none-any", true, map[string][]byte{name + "/__init__.py": []byte(source)})
}

// ExtWheel is a wheel of one C extension module, name, built here with
// gcc against python's headers: name.add(a, b) returns a + b, computed in
// C (and name.where() the file it was loaded from).
func ExtWheel(t testing.TB, python, name, version string) ([]byte, string) {
	t.Helper()
	out, err := exec.Command(python, "-c", `import sys, sysconfig
print(sysconfig.get_paths()["include"]); print(sysconfig.get_config_var("EXT_SUFFIX")); print("cp%d%d" % sys.version_info[:2])`).Output()
	if err != nil {
		testenv.Missing(t, "asking %s for its headers: %v", python, err)
	}
	lines := strings.Fields(string(out))
	include, suffix, abi := lines[0], lines[1], lines[2]
	if _, err := os.Stat(filepath.Join(include, "Python.h")); err != nil {
		testenv.Missing(t, "%s has no Python.h (Debian's python3-dev): %v", python, err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testenv.Missing(t, "gcc builds the test's C extension: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, name+".c")
	code := fmt.Sprintf(`#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
	long a, b;
	if (!PyArg_ParseTuple(args, "ll", &a, &b))
		return NULL;
	return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b, in C"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%[1]s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%[1]s(void) { return PyModule_Create(&module); }
`, name)
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, name+suffix)
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-I"+include, "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("building the C extension: %v\n%s", err, out)
	}
	lib, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	return wheel(t, name, version, abi+"-"+abi+"-linux_x86_64", false, map[string][]byte{name + suffix: lib})
}

// BearerAPI answers 200 to a request with Authorization: Bearer Token,
// naming the path, and 401 to any other.
type BearerAPI struct {
	Token        string
	Served       atomic.Int32
	Unauthorized atomic.Int32
}

func (a *BearerAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+a.Token {
		a.Unauthorized.Add(1)
		http.Error(w, "a bearer token is required", http.StatusUnauthorized)
		return
	}
	a.Served.Add(1)
	fmt.Fprintf(w, "authorized %s", r.URL.Path)
}

// Holder is a plain TCP host that keeps every connection open until the
// other side closes it, and says when that happens: a connection kept
// past its call must end with the call. Each connection names itself in
// its first line; the holder answers "held" and then says nothing more,
// so that only a close on the other side ends it.
type Holder struct {
	ln     net.Listener
	mu     sync.Mutex
	open   map[string]bool
	closed map[string]bool
}

func ServeHolder(t testing.TB) *Holder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &Holder{ln: ln, open: map[string]bool{}, closed: map[string]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go h.hold(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return h
}

func (h *Holder) hold(c net.Conn) {
	defer c.Close()
	line := make([]byte, 0, 64)
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := c.Read(b); err != nil {
			return
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	id := string(line)
	h.mu.Lock()
	h.open[id] = true
	h.mu.Unlock()
	io.WriteString(c, "held\n")
	io.Copy(io.Discard, c)
	h.mu.Lock()
	h.closed[id] = true
	h.mu.Unlock()
}

// Opened and Closed say whether the connection named id was opened, and
// has been closed by the other side.
func (h *Holder) Opened(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open[id]
}

func (h *Holder) Closed(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed[id]
}

func (h *Holder) Port() int { return h.ln.Addr().(*net.TCPAddr).Port }
