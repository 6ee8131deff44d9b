package policy

// MaskedPaths returns the paths under /proc that are hidden from the code
// (a file is covered by /dev/null, a directory by an empty read-only tmpfs).
// They either leak host state (kcore, timer_list, sched_debug, acpi), or
// drive the host kernel (sysrq-trigger), or name keys and secrets (keys).
func MaskedPaths() []string {
	return []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/interrupts",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/sched_debug",
		"/proc/scsi",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sysrq-trigger",
		"/proc/kallsyms",
		"/proc/kmsg",
		"/proc/vmallocinfo",
		"/proc/pagetypeinfo",
		"/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
}

// ReadonlyPaths returns the paths under /proc that stay visible but can
// never be written: the kernel tunables and the host's interrupt and bus
// configuration.
func ReadonlyPaths() []string {
	return []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
	}
}

// Device is a character device node created in the sandbox's /dev.
type Device struct {
	Path         string
	Major, Minor int64
}

// Devices returns the only device nodes in /dev: the ones ordinary programs
// open (null, zero, full, random, urandom, tty). No disk, no memory, no
// kernel message device.
func Devices() []Device {
	return []Device{
		{Path: "/dev/null", Major: 1, Minor: 3},
		{Path: "/dev/zero", Major: 1, Minor: 5},
		{Path: "/dev/full", Major: 1, Minor: 7},
		{Path: "/dev/random", Major: 1, Minor: 8},
		{Path: "/dev/urandom", Major: 1, Minor: 9},
		{Path: "/dev/tty", Major: 5, Minor: 0},
	}
}

// Env returns the sandbox's whole environment. It is an allowlist built
// here, never derived from the server's own environment, so nothing of the
// server (least of all its auth token) can reach the code.
func Env() []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=/tmp",
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"PYTHONIOENCODING=utf-8",
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONNOUSERSITE=1",
		// Unbuffered, so what a program printed before a timeout or an OOM
		// kill reaches the caller instead of dying in a stdio buffer.
		"PYTHONUNBUFFERED=1",
		"TMPDIR=/tmp",
	}
}
