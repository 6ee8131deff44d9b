package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeDpkg writes a dpkg database: status holds stanzas, info/<name>.list
// the file lists.
func fakeDpkg(t *testing.T, status string, lists map[string][]string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "info"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, files := range lists {
		data := "/.\n" + strings.Join(files, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, "info", name+".list"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// stanza is one installed package of a status file.
func stanza(name, arch, depends string, extra ...string) string {
	s := "Package: " + name + "\nStatus: install ok installed\nArchitecture: " + arch + "\n"
	if depends != "" {
		s += "Depends: " + depends + "\n"
	}
	for _, e := range extra {
		s += e + "\n"
	}
	return s + "Description: a package\n continued on\n .\n and on\n"
}

// testStatus models matplotlib, pandas and their neighbours as Debian 12
// has them, trimmed.
var testStatus = strings.Join([]string{
	stanza("dpkg", "amd64", ""),
	stanza("python3", "amd64", "python3.11 (>= 3.11.2-1~)"),
	stanza("python3-numpy", "amd64", "python3-pkg-resources, python3 (<< 3.12), python3:any, libblas3 | libblas.so.3, libc6 (>= 2.35)",
		"Provides: python3-numpy-abi9, python3-f2py"),
	stanza("python3-pkg-resources", "all", "python3:any"),
	stanza("python3-pandas", "all", "python3-dateutil, python3-numpy (>= 1:1.18.5~) | python3 (<< 3.10), python3-tz (>= 2022.1~), python3-pandas-lib (>= 1.5.3+dfsg)"),
	stanza("python3-pandas-lib", "amd64", "libc6 (>= 2.29), python3-numpy-abi9"),
	stanza("python3-dateutil", "all", "python3-six (>= 1.5), python3:any, tzdata"),
	stanza("python3-six", "all", "python3:any"),
	stanza("python3-tz", "all", "tzdata, python3:any"),
	stanza("tzdata", "all", "debconf (>= 0.5) | debconf-2.0"),
	stanza("debconf", "all", "perl-base (>= 5.20.1-3~)"),
	stanza("libblas3", "amd64", "libc6 (>= 2.29)", "Provides: libblas.so.3"),
	stanza("python3-matplotlib", "amd64", "libjs-jquery, python-matplotlib-data (>= 3.6.3), python3-pil.imagetk, python3-numpy-abi9, python3-fonttools, python3-pil, libfreetype6 (>= 2.2.1)"),
	stanza("python-matplotlib-data", "all", "fonts-dejavu-core, fonts-lyx"),
	stanza("fonts-dejavu-core", "all", ""),
	stanza("fonts-lyx", "all", ""),
	stanza("libjs-jquery", "all", ""),
	stanza("libfreetype6", "amd64", "libc6 (>= 2.33)"),
	stanza("python3-pil", "amd64", "python3:any, mime-support | python3-pil.imagetk, libc6 (>= 2.14)"),
	stanza("python3-pil.imagetk", "amd64", "python3-pil (= 9.4.0-1.1+deb12u1), python3-tk (>= 3.4.1-2)"),
	stanza("python3-tk", "amd64", "python3:any, libtk8.6 (>= 8.6.0)"),
	stanza("python3-fonttools", "amd64", "python3-brotli (>= 1.0.9), python3-scipy (>= 1.8.1) | python3-munkres (>= 1.1.4), python3-sympy, unicode-data (>= 14.0.0)"),
	stanza("python3-brotli", "amd64", "python3:any"),
	stanza("python3-sympy", "all", "python3:any, python3-mpmath"),
	stanza("python3-mpmath", "all", "python3:any"),
	stanza("python3-munkres", "all", "python3:any"),
	stanza("unicode-data", "all", ""),
	"Package: python3-removed\nStatus: deinstall ok config-files\nArchitecture: all\n",
	stanza("python3-broken", "all", "python3-gone (>= 1), python3-tz"),
}, "\n")

func TestParseDepends(t *testing.T) {
	tests := []struct {
		field string
		want  string
	}{
		{"", ""},
		{"python3:any", "python3"},
		{"python3-numpy (>= 1:1.18.5~) | python3 (<< 3.10), python3-tz (>= 2022.1~)", "python3-numpy|python3 python3-tz"},
		{"libblas3 | libblas.so.3, libc6 (>= 2.35)", "libblas3|libblas.so.3 libc6"},
		{"python3-pil.imagetk:amd64 (= 1)", "python3-pil.imagetk"},
	}
	for _, tt := range tests {
		var groups []string
		for _, g := range parseDepends(tt.field) {
			groups = append(groups, strings.Join(g, "|"))
		}
		if got := strings.Join(groups, " "); got != tt.want {
			t.Errorf("parseDepends(%q) = %q, want %q", tt.field, got, tt.want)
		}
	}
}

func names(ps []*debPackage) string {
	var n []string
	for _, p := range ps {
		n = append(n, p.name)
	}
	slices.Sort(n)
	return strings.Join(n, " ")
}

func TestSelectPackages(t *testing.T) {
	db, err := readDpkg(fakeDpkg(t, testStatus, nil))
	if err != nil {
		t.Fatal(err)
	}
	if db.native != "amd64" {
		t.Errorf("native architecture = %q, want amd64 (dpkg's)", db.native)
	}
	tests := []struct {
		name       string
		asked      []string
		wantPython string
		wantData   string
	}{
		{
			"pandas: python3-* deps, recursively, and what provides a virtual one",
			[]string{"pandas"},
			"python3-dateutil python3-numpy python3-pandas python3-pandas-lib python3-pkg-resources python3-six python3-tz",
			"tzdata",
		},
		{
			"matplotlib: no Tk, no JavaScript, fontTools without its extras, data packages through data packages",
			[]string{"matplotlib"},
			"python3-fonttools python3-matplotlib python3-numpy python3-pil python3-pkg-resources",
			"fonts-dejavu-core fonts-lyx python-matplotlib-data",
		},
		{
			"fontTools named: its extras too, an alternative taken when the first is missing",
			[]string{"fonttools"},
			"python3-brotli python3-fonttools python3-mpmath python3-munkres python3-sympy",
			"",
		},
		{
			"a package never taken as a dependency is taken when named",
			[]string{"python3-tk"},
			"python3-tk",
			"",
		},
		{
			"a virtual package named is its provider",
			[]string{"python3-numpy-abi9"},
			"python3-numpy python3-pkg-resources",
			"",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, err := Options{Packages: tt.asked}.requests()
			if err != nil {
				t.Fatal(err)
			}
			sel, err := db.selectPackages(reqs, nil)
			if err != nil {
				t.Fatalf("selectPackages(%q) = %v", tt.asked, err)
			}
			if got := names(sel.python); got != tt.wantPython {
				t.Errorf("selectPackages(%q): python = %q, want %q", tt.asked, got, tt.wantPython)
			}
			if got := names(sel.data); got != tt.wantData {
				t.Errorf("selectPackages(%q): data = %q, want %q", tt.asked, got, tt.wantData)
			}
		})
	}
}

func TestMissingPackagesError(t *testing.T) {
	db, err := readDpkg(fakeDpkg(t, testStatus, nil))
	if err != nil {
		t.Fatal(err)
	}
	// What the package lists have: only a name Debian has gets its
	// apt-get line.
	inDebian := map[string]availability{"python3-scipy": available, "python3-sklearn": available, "python3-gone": available,
		"python3-nope": unknown, "python3-removed": unknown, "python3-nosuchpkg-zz": unavailable}
	saved := aptHas
	aptHas = func(deb string) availability { return inDebian[deb] }
	t.Cleanup(func() { aptHas = saved })
	tests := []struct {
		asked []string
		want  string
	}{
		{
			[]string{"nosuchpkg_zz"},
			"{Packages}: nosuchpkg_zz is not installed on this host; Debian has no package python3-nosuchpkg-zz (apt-cache found none: check the name, or run apt-get update first); " +
				"a package Debian lacks can come from a directory of packages instead: pip install --target DIR nosuchpkg_zz, then {PackagesDir}=DIR",
		},
		{
			[]string{"scipy", "nosuchpkg_zz"},
			"{Packages}: nosuchpkg_zz and scipy are not installed on this host; install python3-scipy with: apt-get install -y python3-scipy; " +
				"Debian has no package python3-nosuchpkg-zz (apt-cache found none: check the name, or run apt-get update first); " +
				"a package Debian lacks can come from a directory of packages instead: pip install --target DIR nosuchpkg_zz, then {PackagesDir}=DIR",
		},
		{
			[]string{"numpy", "scipy"},
			"{Packages}: scipy is not installed on this host; install it with: apt-get install -y python3-scipy",
		},
		{
			[]string{"Pillow", "scikit-learn", "pandas", "python3-removed"},
			"{Packages}: python3-removed and scikit-learn are not installed on this host; install them with: apt-get install -y python3-removed python3-sklearn",
		},
		{
			[]string{"broken", "sympy", "nope"},
			"{Packages}: nope and python3-gone (needed by python3-broken) are not installed on this host; install them with: apt-get install -y python3-nope python3-gone",
		},
	}
	for _, tt := range tests {
		reqs, err := Options{Packages: tt.asked}.requests()
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.selectPackages(reqs, nil)
		var missing *MissingPackagesError
		if !errors.As(err, &missing) || err.Error() != tt.want {
			t.Errorf("selectPackages(%q) = %v,\nwant %s", tt.asked, err, tt.want)
		}
	}
}

func TestDpkgFiles(t *testing.T) {
	dir := fakeDpkg(t, testStatus+"\n"+stanza("libfoo1", "amd64", "", "Multi-Arch: same"), map[string][]string{
		"python3-six":   {"/usr", "/usr/lib/python3/dist-packages/six.py", "/usr/share/doc/python3-six"},
		"libfoo1:amd64": {"/usr/lib/x86_64-linux-gnu/libfoo.so.1"},
	})
	db, err := readDpkg(dir)
	if err != nil {
		t.Fatal(err)
	}
	src := newSources()
	got, err := db.files(db.lookup("python3-six"), src)
	if want := "/usr /usr/lib/python3/dist-packages/six.py /usr/share/doc/python3-six"; err != nil || strings.Join(got, " ") != want {
		t.Errorf("files(python3-six) = %q, %v; want %q", got, err, want)
	}
	if got, err := db.files(db.lookup("libfoo1"), src); err != nil || len(got) != 1 {
		t.Errorf("files(libfoo1), a Multi-Arch: same package = %q, %v; want its <name>:<arch>.list", got, err)
	}
	if _, err := db.files(db.lookup("python3-tz"), src); err == nil || !strings.Contains(err.Error(), "python3-tz") {
		t.Errorf("files(python3-tz) without a list = %v, want an error naming it", err)
	}
	// The lists read are in the manifest: an upgrade rewrites them.
	m := src.manifest()
	var recorded []string
	for _, s := range m.Sources {
		recorded = append(recorded, filepath.Base(s.Path)+":"+string(s.Kind))
	}
	if got, want := strings.Join(recorded, " "), "python3-six.list:file libfoo1:amd64.list:file python3-tz.list:absent"; got != want {
		t.Errorf("sources recorded = %q, want %q", got, want)
	}
}
