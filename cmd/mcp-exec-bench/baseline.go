package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// baselinePython checks that path is an interpreter binary and returns
// where it resolves to. A shim (pyenv's bash script, a wrapper) adds a
// shell start to every baseline call and would flatter the sandbox.
func baselinePython(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("finding the baseline interpreter: %w", err)
	}
	f, err := os.Open(real)
	if err != nil {
		return "", fmt.Errorf("opening the baseline interpreter: %w", err)
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "\x7fELF" {
		return "", fmt.Errorf("the baseline interpreter %s (%s) is not an ELF binary: a shim would flatter the ratios; pass --python with the real interpreter", path, real)
	}
	return real, nil
}

// pythonCaller runs python -c code as a fresh process, as a client without
// a sandbox would, and fails unless it printed want and exited 0.
func pythonCaller(python string, sn snippet) caller {
	return func(ctx context.Context) (outcome, error) {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, python, "-c", sn.Code)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return outcome{}, fmt.Errorf("%s: %s", ee, lastLine(stderr.String()))
			}
			return outcome{}, fmt.Errorf("running %s: %w", python, err)
		}
		if got := stdout.String(); got != sn.Stdout {
			return outcome{}, fmt.Errorf("stdout %.100q, want %q (stderr: %s)", got, sn.Stdout, lastLine(stderr.String()))
		}
		return outcome{}, nil
	}
}

func pythonVersion(ctx context.Context, python string) (string, error) {
	out, err := exec.CommandContext(ctx, python, "-c", "import platform; print(platform.python_version())").Output()
	if err != nil {
		return "", fmt.Errorf("asking %s its version: %w", python, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// importNames maps the PyPI names MCP_EXEC_PACKAGES takes to the modules
// they install, where the two differ.
var importNames = map[string]string{
	"pillow":          "PIL",
	"pyyaml":          "yaml",
	"scikit-learn":    "sklearn",
	"scikit-image":    "skimage",
	"beautifulsoup4":  "bs4",
	"python-dateutil": "dateutil",
	"opencv-python":   "cv2",
	"pyzmq":           "zmq",
}

// importSnippet imports the packages, as a user's code would.
func importSnippet(packages []string) snippet {
	mods := make([]string, len(packages))
	for i, p := range packages {
		p = strings.ToLower(p)
		if m, ok := importNames[p]; ok {
			mods[i] = m
		} else {
			mods[i] = strings.ReplaceAll(p, "-", "_")
		}
	}
	return snippet{Code: "import " + strings.Join(mods, ", ")}
}
