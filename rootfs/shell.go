package rootfs

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// shellPath is the shell os.system and subprocess's shell=True run.
const shellPath = "/bin/sh"

// shell puts busybox (the host's busybox-static executable) into the
// rootfs with a link for each of its applets, sh among them, in the dir
// holding /bin/sh (/usr/bin on a merged-/usr host, which PATH has). Names
// already taken (python3) are left alone. It returns the libraries busybox
// needs: none for busybox-static, whatever a dynamic one needs.
func (b *builder) shell(r *resolver, busybox string) ([]dependency, error) {
	real, err := b.place(busybox)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(b.ctx, busybox)
	if err != nil {
		return nil, err
	}
	if !strings.Contains("\n"+strings.Join(applets, "\n")+"\n", "\nsh\n") {
		return nil, fmt.Errorf("adding the shell: %s has no sh applet", busybox)
	}
	bin, err := b.place(filepath.Dir(shellPath))
	if err != nil {
		return nil, err
	}
	target := real
	if filepath.Dir(real) == bin {
		target = filepath.Base(real)
	}
	for _, a := range applets {
		link := filepath.Join(bin, a)
		if b.made[link] {
			continue
		}
		if err := b.symlink(link, target); err != nil {
			return nil, err
		}
	}
	deps, err := r.closure(busybox, nil)
	if err != nil {
		return nil, fmt.Errorf("adding the shell: %w", err)
	}
	return deps, nil
}

// busyboxApplets asks busybox for its applets: they differ between builds,
// and the binary is the only one that knows. busybox-static is the host's
// own, from its distribution.
func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, busybox, "--list")
	cmd.Env = []string{}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("listing the applets of %s: %w: %s", busybox, err, strings.TrimSpace(stderr.String()))
	}
	var applets []string
	for _, a := range strings.Fields(stdout.String()) {
		// An applet is a file name in /bin; anything else is not one.
		if a != "" && !strings.ContainsAny(a, "/\x00") && a != "." && a != ".." {
			applets = append(applets, a)
		}
	}
	return applets, nil
}
