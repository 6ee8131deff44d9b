package policy

import "strings"

// WorkDir is the code's working directory and, in a container, its one
// writable place; the regular files it leaves under OutputsDir come back
// with the result. The bundle mounts them, the init makes and reads back
// the outputs dir, the server describes both, and the plotting backend
// saves there.
const (
	WorkDir     = "/tmp"
	OutputsName = "outputs"
	OutputsDir  = WorkDir + "/" + OutputsName
)

// DataDir is where an operator's directory of data is, read-only, in
// every sandbox, when the server has one (MCP_EXEC_DATA_DIR): nothing of
// it can be written, run, or honoured as setuid or a device.
const DataDir = "/data"

// DataMountOptions are the data dir's mount options: read-only, no setuid,
// no devices and nothing executed, all the way down (a mount below the
// dir on the host comes in too, and a plain "ro" would hold only for the
// top one).
func DataMountOptions() []string {
	return []string{"rbind", "ro", "nosuid", "nodev", "noexec", "rro", "rnosuid", "rnodev", "rnoexec"}
}

// MaskedPaths returns the paths under /proc that are hidden from the code
// (a file is covered by /dev/null, a directory by an empty read-only tmpfs).
// They either leak host state (kcore, timer_list, sched_debug, acpi), or
// drive the host kernel (sysrq-trigger), or name keys and secrets (keys),
// or identify and describe the host (its kernel command line, boot id,
// disks, modules, devices, memory layout and pressure) without any use to
// a Python program. What stays readable, and why, is in docs/sandbox.md: cpu
// and memory totals (os.cpu_count and psutil read /proc/stat and
// /proc/meminfo), uptime and load, the kernel version (uname(2) gives it
// anyway).
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
		// The host's identity and configuration.
		"/proc/cmdline",
		"/proc/bootconfig",
		"/proc/config.gz",
		"/proc/sys/kernel/random/boot_id",
		"/proc/modules",
		"/proc/partitions",
		"/proc/diskstats",
		"/proc/swaps",
		"/proc/devices",
		"/proc/misc",
		"/proc/iomem",
		"/proc/ioports",
		"/proc/dma",
		"/proc/mtrr",
		"/proc/fb",
		"/proc/consoles",
		"/proc/driver",
		"/proc/tty",
		"/proc/execdomains",
		"/proc/key-users",
		"/proc/cgroups",
		"/proc/crypto",
		"/proc/mdstat",
		"/proc/buddyinfo",
		"/proc/zoneinfo",
		"/proc/slabinfo",
		"/proc/kpagecount",
		"/proc/kpageflags",
		"/proc/kpagecgroup",
		"/proc/pressure",
		"/proc/schedstat",
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
		// A wide terminal's size, for what fits its output to one
		// (shutil.get_terminal_size): there is no terminal, and 80
		// columns hide most of a table.
		"COLUMNS=200",
		"LINES=60",
	}
}

// EnvAllowed reports whether key may be set in the sandbox's environment:
// the keys of Env, the Python settings, the few settings that tell
// numeric and plotting libraries how to behave in a sandbox (how many
// threads a CPU quota allows, which matplotlib backend saves figures),
// and, with the network allowlist on, where HTTP clients find the relay
// and whom they trust, and pip's settings. A secret of the server has no
// business in any of them (the egress proxy adds credentials outside the
// sandbox; an index URL with credentials in it is refused).
func EnvAllowed(key string) bool {
	switch key {
	case "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "COLUMNS", "LINES",
		"MPLBACKEND", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_MAX_THREADS",
		"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
		"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE":
		return true
	}
	return strings.HasPrefix(key, "PYTHON") || strings.HasPrefix(key, "PIP_")
}

// RelayPort is where, with the network allowlist on, the sandbox's init
// listens on the sandbox's own 127.0.0.1 and relays each connection to the
// server's egress proxy: the one way out of a network namespace that has
// only lo. Squid's port, as HTTP proxies are found on.
const RelayPort = 3128
