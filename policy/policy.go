// Package policy defines what a sandboxed call may do: the capability sets
// (all empty), the seccomp filter, the /proc paths that are masked or
// read-only, the devices that exist, and the resource limits.
//
// It is the security contract in code form, so it stays pure data:
//   - no os, no environment, no clock; the same input gives the same output;
//   - every function returns a fresh value that the caller may change freely,
//     never a package-level slice or map that one caller could alter for all;
//   - every syscall group that is denied says in one line why.
//
// Nothing here knows how a container is run; bundle turns these values into an
// OCI spec.
package policy

// UID and GID are the identity the sandboxed code runs as: an unprivileged
// id that owns nothing on the host (the "nonroot" id of distroless images).
const (
	UID = 65532
	GID = 65532
)

// Hostname is the hostname inside every sandbox.
const Hostname = "sandbox"
