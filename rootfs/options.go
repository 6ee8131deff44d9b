package rootfs

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Options say what a rootfs holds beyond the interpreter, its standard
// library and the skeleton. The zero value is the stdlib-only rootfs.
type Options struct {
	// Packages are Python packages taken from the host's Debian python3-*
	// packages, with the python3-* packages they depend on, the shared
	// libraries of all of them and the data they read: PyPI names (numpy,
	// pillow, pyyaml), or Debian package names (python3-numpy). Nothing is
	// downloaded; a package the host lacks fails the build.
	Packages []string
	// Shell adds /bin/sh and the common command-line tools: the applets of
	// Debian's busybox-static.
	Shell bool
	// Preload are modules every interpreter of the rootfs imports as it
	// starts (a .pth file in its site dir): a prepared sandbox has them
	// loaded before its call comes, and a cold one pays for them as the
	// code would. Module names, in import order.
	Preload []string
}

// moduleName is a dotted Python module name.
var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

// debianNames maps the PyPI names whose Debian package is not
// python3-<name>: Debian names a package after the module it installs
// (python3-yaml for PyPI's pyyaml, which installs yaml). Any other name is
// taken as python3-<name>, so import names Debian uses (yaml, sklearn) work
// too. Keep it to names people ask for; python3-foo is always accepted.
var debianNames = map[string]string{
	"pillow":                 "python3-pil",
	"pyyaml":                 "python3-yaml",
	"scikit-learn":           "python3-sklearn",
	"scikit-image":           "python3-skimage",
	"beautifulsoup4":         "python3-bs4",
	"opencv-python":          "python3-opencv",
	"opencv-python-headless": "python3-opencv",
	"python-dateutil":        "python3-dateutil",
	"pytz":                   "python3-tz",
	"attrs":                  "python3-attr",
	"pyzmq":                  "python3-zmq",
	"pyopenssl":              "python3-openssl",
}

// debianPackageName is what dpkg accepts as a package name. It also keeps
// the name safe to join into /var/lib/dpkg/info/<name>.list.
var debianPackageName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// pypiName is what PEP 508 accepts as a project name (lower-cased).
var pypiName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)

// pep503Separators are the runs PEP 503 normalizes to one "-".
var pep503Separators = regexp.MustCompile(`[-_.]+`)

// DebianPackage returns the Debian package that provides the Python package
// name: name itself when it is already a python3-* package name, else its
// PEP 503 normalized form looked up in a small table of exceptions
// (pillow -> python3-pil), else python3-<name>. It fails on what cannot be a
// package name.
func DebianPackage(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "python3-") {
		if !pypiName.MatchString(n) {
			return "", fmt.Errorf("{Packages}: %q is not a package name", name)
		}
		n = pep503Separators.ReplaceAllString(n, "-")
		if deb, ok := debianNames[n]; ok {
			n = deb
		} else {
			n = "python3-" + n
		}
	}
	if n == "python3-" || !debianPackageName.MatchString(n) {
		return "", fmt.Errorf("{Packages}: %q is not a package name", name)
	}
	return n, nil
}

// request is one named package: as the user wrote it, for messages, and the
// Debian package it names.
type request struct {
	asked, deb string
}

// requests maps o.Packages to Debian packages, sorted by Debian name, each
// once (the first spelling wins).
func (o Options) requests() ([]request, error) {
	var reqs []request
	seen := map[string]bool{}
	for _, name := range o.Packages {
		deb, err := DebianPackage(name)
		if err != nil {
			return nil, err
		}
		if seen[deb] {
			continue
		}
		seen[deb] = true
		reqs = append(reqs, request{asked: strings.TrimSpace(name), deb: deb})
	}
	slices.SortFunc(reqs, func(a, b request) int { return strings.Compare(a.deb, b.deb) })
	return reqs, nil
}

// Validate checks that every name in o.Packages can be a package name. It
// does not look at the host; Describe and Build say what the host lacks.
func (o Options) Validate() error {
	if _, err := o.requests(); err != nil {
		return err
	}
	for _, m := range o.Preload {
		if !moduleName.MatchString(m) {
			return fmt.Errorf("{Preload}: %q is not a module name", m)
		}
	}
	return nil
}

// Normalize returns o with Packages as Debian package names, sorted, each
// once: "Pillow", "pillow" and "python3-pil" are one package, and one cache
// entry.
func (o Options) Normalize() (Options, error) {
	reqs, err := o.requests()
	if err != nil {
		return Options{}, err
	}
	n := Options{Shell: o.Shell}
	for _, r := range reqs {
		n.Packages = append(n.Packages, r.deb)
	}
	for _, m := range o.Preload {
		if !moduleName.MatchString(m) {
			return Options{}, fmt.Errorf("{Preload}: %q is not a module name", m)
		}
		if !slices.Contains(n.Preload, m) {
			n.Preload = append(n.Preload, m)
		}
	}
	return n, nil
}

// String describes o for logs and cache keys: "packages=python3-numpy,
// python3-pandas shell=true". Normalize first for a canonical form.
func (o Options) String() string {
	s := "packages=" + strings.Join(o.Packages, ",") + " shell=" + strconv.FormatBool(o.Shell)
	if len(o.Preload) > 0 {
		s += " preload=" + strings.Join(o.Preload, ",")
	}
	return s
}

// Key is the cache key of the rootfs built for py with o: Ensure keeps one
// rootfs per key. Equivalent options (see Normalize) have the same key.
func (o Options) Key(py Interpreter) (string, error) {
	n, err := o.Normalize()
	if err != nil {
		return "", err
	}
	return n.key(py), nil
}

// hasPackages says whether o asks for anything of the host's dpkg database.
func (o Options) hasPackages() bool {
	return len(o.Packages) > 0
}
