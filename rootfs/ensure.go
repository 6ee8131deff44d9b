package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lockPoll is how often Ensure retries the cache lock while another process
// builds: flock(2) cannot wait on a context, so it waits in steps.
const lockPoll = 100 * time.Millisecond

type buildFunc func(ctx context.Context, py Interpreter, out string, validate func(context.Context, string) error) error

// Ensure returns the cached rootfs for py under cacheDir (cacheDir/<py.Key()>),
// building it with Build if absent. Several server processes may call it at
// once: the build runs under an flock on cacheDir/.lock, and whoever gets the
// lock second finds the rootfs there. cacheDir is created 0755 if missing: the
// rootfs must be readable by the sandbox's uid.
func Ensure(ctx context.Context, py Interpreter, cacheDir string, validate func(ctx context.Context, dir string) error) (string, error) {
	return ensure(ctx, py, cacheDir, validate, Build)
}

func ensure(ctx context.Context, py Interpreter, cacheDir string, validate func(context.Context, string) error, build buildFunc) (string, error) {
	if cacheDir == "" {
		return "", errors.New("ensuring rootfs: no cache dir (set MCP_EXEC_ROOTFS or HOME)")
	}
	out := filepath.Join(cacheDir, py.Key())
	if ok, err := cached(out); ok || err != nil {
		return out, err
	}

	if err := makeCacheDir(cacheDir); err != nil {
		return "", err
	}
	unlock, err := lockDir(ctx, cacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()

	// Another process may have built it while we waited.
	if ok, err := cached(out); ok || err != nil {
		return out, err
	}
	// Holding the lock, no build is running here: a temp dir is what a
	// killed one left.
	if err := removeLeftovers(cacheDir); err != nil {
		return "", err
	}
	if err := build(ctx, py, out, validate); err != nil {
		return "", fmt.Errorf("ensuring rootfs in %s: %w", cacheDir, err)
	}
	return out, nil
}

// cached reports whether out holds a rootfs. Builds appear by rename, so one
// that exists is complete; if Check still fails someone changed it, and it is
// reported rather than rebuilt behind the user's back.
func cached(out string) (bool, error) {
	if _, err := os.Lstat(out); errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("ensuring rootfs: %w", err)
	}
	if err := Check(out); err != nil {
		return false, fmt.Errorf("ensuring rootfs: cached %w; remove %s to rebuild it", err, out)
	}
	return true, nil
}

func makeCacheDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ensuring rootfs: creating cache dir: %w", err)
	}
	// MkdirAll honours the umask; the sandbox must still read through it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("ensuring rootfs: creating cache dir: %w", err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock. Each call opens the file
// anew, so goroutines of one process exclude each other like processes do.
// The kernel drops the lock when a holder dies, so no stale lock survives a
// killed build.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	p := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ensuring rootfs: opening lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("ensuring rootfs: locking %s: %w", p, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("ensuring rootfs: waiting for the build in %s: %w", dir, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

func removeLeftovers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ensuring rootfs: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("ensuring rootfs: removing the leftovers of a killed build: %w", err)
		}
	}
	return nil
}
