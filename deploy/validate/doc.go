// Package validate checks the deployment recipes under deploy/ offline: the
// Kubernetes manifests, the systemd unit, the MCP registry entry
// (server.json) and the icon. It is its own module so that the server's
// module never pulls in k8s.io/api; it has no code but its tests.
package validate
