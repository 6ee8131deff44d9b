package rootfs

import (
	"strings"
	"testing"
)

func TestDebianPackage(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"numpy", "python3-numpy"},
		{"NumPy", "python3-numpy"},
		{" pandas ", "python3-pandas"},
		{"pillow", "python3-pil"},
		{"Pillow", "python3-pil"},
		{"PyYAML", "python3-yaml"},
		{"scikit-learn", "python3-sklearn"},
		{"scikit_learn", "python3-sklearn"},
		{"beautifulsoup4", "python3-bs4"},
		{"opencv-python", "python3-opencv"},
		{"python-dateutil", "python3-dateutil"},
		{"pytz", "python3-tz"},
		// Import names Debian names its packages after.
		{"yaml", "python3-yaml"},
		{"PIL", "python3-pil"},
		{"sklearn", "python3-sklearn"},
		// PEP 503: runs of -_. are one -.
		{"zope.interface", "python3-zope-interface"},
		{"typing__extensions", "python3-typing-extensions"},
		// Debian names are taken as they are, dots and all.
		{"python3-numpy", "python3-numpy"},
		{"python3-pil.imagetk", "python3-pil.imagetk"},
		{"Python3-Numpy", "python3-numpy"},
	}
	for _, tt := range tests {
		got, err := DebianPackage(tt.name)
		if err != nil || got != tt.want {
			t.Errorf("DebianPackage(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", " ", "python3-", "num py", "../../etc/passwd", "numpy/x", "numpy\x00", "python3-a/b", "-numpy", "nümpy"} {
		got, err := DebianPackage(bad)
		if err == nil || !strings.HasPrefix(err.Error(), "{Packages}: ") {
			t.Errorf("DebianPackage(%q) = %q, %v; want an error naming {Packages}", bad, got, err)
		}
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		in   Options
		want string
	}{
		{Options{}, "packages= shell=false"},
		{Options{Shell: true}, "packages= shell=true"},
		{Options{Packages: []string{"pandas", "NumPy", "numpy", "python3-numpy"}}, "packages=python3-numpy,python3-pandas shell=false"},
		{Options{Packages: []string{"pillow", "PIL", "python3-pil"}, Shell: true}, "packages=python3-pil shell=true"},
	}
	for _, tt := range tests {
		got, err := tt.in.Normalize()
		if err != nil || got.String() != tt.want {
			t.Errorf("%+v.Normalize() = %q, %v; want %q", tt.in, got.String(), err, tt.want)
		}
	}
	if _, err := (Options{Packages: []string{"numpy", "a b"}}).Normalize(); err == nil || !strings.Contains(err.Error(), `"a b"`) {
		t.Errorf("Normalize with a bad name = %v, want an error naming it", err)
	}
	if err := (Options{Packages: []string{"numpy", "a/b"}}).Validate(); err == nil {
		t.Errorf("Validate with a bad name = nil, want an error")
	}
}

func TestOptionsKey(t *testing.T) {
	py := Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Hash: "abc"}
	key := func(o Options) string {
		t.Helper()
		k, err := o.Key(py)
		if err != nil {
			t.Fatalf("%+v.Key: %v", o, err)
		}
		return k
	}
	if got, want := key(Options{}), py.Key(); got != want {
		t.Errorf("Options{}.Key(py) = %s, want py.Key() %s", got, want)
	}
	base := key(Options{Packages: []string{"numpy", "pandas"}})
	for name, same := range map[string]Options{
		"reordered":  {Packages: []string{"pandas", "numpy"}},
		"duplicated": {Packages: []string{"numpy", "pandas", "numpy"}},
		"cased":      {Packages: []string{"NumPy", "Pandas"}},
		"debian":     {Packages: []string{"python3-numpy", "python3-pandas"}},
	} {
		if got := key(same); got != base {
			t.Errorf("Key with packages %s = %s, want %s as for numpy,pandas", name, got, base)
		}
	}
	for name, other := range map[string]Options{
		"none":  {},
		"fewer": {Packages: []string{"numpy"}},
		"more":  {Packages: []string{"numpy", "pandas", "scipy"}},
		"shell": {Packages: []string{"numpy", "pandas"}, Shell: true},
	} {
		if got := key(other); got == base {
			t.Errorf("Key with %s packages = %s, the same as for numpy,pandas", name, got)
		}
	}
}
