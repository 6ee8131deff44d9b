package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

const manifestDir = "../kubernetes"

// decodeManifests decodes every YAML document of a file into its typed
// Kubernetes object, strictly: an unknown or duplicated field (a misspelt
// one) is an error, as is a kind this test does not know.
func decodeManifests(data []byte) ([]any, error) {
	var objs []any
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "networking.k8s.io/v1/NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		case "node.k8s.io/v1/RuntimeClass":
			obj = &nodev1.RuntimeClass{}
		default:
			return nil, fmt.Errorf("document %d: unexpected kind %s %s", i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

func loadManifests(t *testing.T, name string) []any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(manifestDir, name))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return objs
}

func TestManifestsDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeManifests(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	// The decoder itself must refuse what the API server would: a misspelt
	// field, a duplicated one, a field at the wrong level.
	data, err := os.ReadFile(filepath.Join(manifestDir, "mcp-exec.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"misspelt field", "readinessProbe:", "readinesProbe:"},
		{"misspelt nested field", "seccompProfile:", "secompProfile:"},
		{"field at the wrong level", "      hostUsers: true", "      containersHostUsers: true"},
		{"duplicated field", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n"},
	} {
		bad := strings.Replace(string(data), tc.old, tc.new, 1)
		if bad == string(data) {
			t.Fatalf("%s: %q not found in mcp-exec.yaml", tc.name, tc.old)
		}
		if _, err := decodeManifests([]byte(bad)); err == nil {
			t.Errorf("decodeManifests(mcp-exec.yaml with a %s): no error", tc.name)
		}
	}
}

// deployment is the one Deployment of a manifest file, checked for what
// both variants share.
func deployment(t *testing.T, objs []any) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	var d *appsv1.Deployment
	var svc *corev1.Service
	var np *networkingv1.NetworkPolicy
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			d = o
		case *corev1.Service:
			svc = o
		case *networkingv1.NetworkPolicy:
			np = o
		}
	}
	if d == nil || svc == nil || np == nil {
		t.Fatalf("want a Deployment, a Service and a NetworkPolicy; got %T", objs)
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("want one container, got %d (and %d init containers)", len(spec.Containers), len(spec.InitContainers))
	}
	c := &spec.Containers[0]

	// What the API server checks: the selector selects the template.
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Deployment selector %v does not match its template's labels %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not select the pods (labels %v)", k, v, d.Spec.Template.Labels)
		}
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == 8080 && p.TargetPort == intstr.FromString("http")
	}) {
		t.Errorf("Service ports %v: want 8080 to the container port named http", svc.Spec.Ports)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) {
		t.Errorf("container ports %v: want http=8080", c.Ports)
	}
	if got := labels.Set(np.Spec.PodSelector.MatchLabels); !sel.Matches(got) || len(np.Spec.Egress) != 0 ||
		!slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("NetworkPolicy: want the pods selected and egress closed, got %+v", np.Spec)
	}

	env := envMap(c)
	for k, want := range map[string]string{
		"MCP_EXEC_TRANSPORT":      "http",
		"MCP_EXEC_ADDR":           "0.0.0.0:8080",
		"MCP_EXEC_HTTP_STATELESS": "true",
	} {
		if env[k] != want {
			t.Errorf("env %s = %q, want %q", k, env[k], want)
		}
	}
	tok := findEnv(c, "MCP_EXEC_AUTH_TOKEN")
	if tok == nil || tok.Value != "" || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
		tok.ValueFrom.SecretKeyRef.Name != "mcp-exec-auth" || tok.ValueFrom.SecretKeyRef.Key != "token" {
		t.Errorf("MCP_EXEC_AUTH_TOKEN: want it from Secret mcp-exec-auth, key token; got %+v", tok)
	}
	// Ready: the rootfs proved, a sandbox can start, not stopping. Alive:
	// the process answers, which it does from the moment it binds, while
	// the rootfs is built too, so that a slow first start is not killed.
	for name, probe := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"readiness": {c.ReadinessProbe, "/readyz"}, "liveness": {c.LivenessProbe, "/healthz"}} {
		p := probe.p
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe.path || p.HTTPGet.Port != intstr.FromString("http") {
			t.Errorf("%s probe: want GET %s on port http, got %+v", name, probe.path, p)
		}
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Errorf("host namespaces: network %v, pid %v, ipc %v; want none", spec.HostNetwork, spec.HostPID, spec.HostIPC)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken: want false (the server talks to no API)")
	}
	if m := mountOf(c, "/run/mcp-exec"); m == nil || volume(spec, m.Name) == nil || volume(spec, m.Name).EmptyDir == nil ||
		volume(spec, m.Name).EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("/run/mcp-exec: want an emptyDir of medium Memory")
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem: want true")
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Errorf("privileged: true; never")
	}
	return d, c
}

func TestPrivilegedVariant(t *testing.T) {
	d, c := deployment(t, loadManifests(t, "mcp-exec.yaml"))
	spec := d.Spec.Template.Spec
	sc := c.SecurityContext

	if spec.HostUsers == nil || !*spec.HostUsers {
		t.Errorf("hostUsers: want true (each call's user namespace, cgroups and devices need root of the node's user namespace)")
	}
	if spec.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q: want none", *spec.RuntimeClassName)
	}
	// The rootfs cache's bound keeps it under its emptyDir's sizeLimit,
	// past which the kubelet evicts the pod.
	if m := mountOf(c, "/var/cache/mcp-exec"); m == nil || volume(spec, m.Name) == nil || volume(spec, m.Name).EmptyDir == nil ||
		volume(spec, m.Name).EmptyDir.SizeLimit == nil {
		t.Errorf("/var/cache/mcp-exec: want an emptyDir with a sizeLimit")
	} else if bound, err := strconv.ParseInt(envMap(c)["MCP_EXEC_CACHE_MAX_MB"], 10, 64); err != nil ||
		bound<<20 >= volume(spec, m.Name).EmptyDir.SizeLimit.Value() {
		t.Errorf("MCP_EXEC_CACHE_MAX_MB = %q: want a bound below the cache emptyDir's sizeLimit %v", envMap(c)["MCP_EXEC_CACHE_MAX_MB"], volume(spec, m.Name).EmptyDir.SizeLimit)
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Errorf("privileged: want false, set explicitly")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot {
		t.Errorf("runAsUser %s, runAsNonRoot %s: want 0 and false", show(sc.RunAsUser), show(sc.RunAsNonRoot))
	}
	wantCaps := []string{"CHOWN", "DAC_OVERRIDE", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"}
	if got := capNames(sc.Capabilities.Add); !slices.Equal(got, wantCaps) {
		t.Errorf("capabilities.add = %v, want exactly %v", got, wantCaps)
	}
	if got := capNames(sc.Capabilities.Drop); !slices.Equal(got, []string{"ALL"}) {
		t.Errorf("capabilities.drop = %v, want [ALL]", got)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined {
		t.Errorf("seccompProfile: want Unconfined")
	}
	if sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined {
		t.Errorf("appArmorProfile: want Unconfined")
	}
	// The API server refuses Unmasked with hostUsers: true
	// (pkg/apis/core/validation: "`hostUsers` must be false to use
	// `Unmasked`").
	if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
		t.Errorf("procMount %s with hostUsers: true: the API server refuses it", *sc.ProcMount)
	}
	// The API server refuses allowPrivilegeEscalation: false with SYS_ADMIN.
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation: false with CAP_SYS_ADMIN: the API server refuses it")
	}
	m := mountOf(c, "/sys/fs/cgroup")
	if m == nil || m.ReadOnly {
		t.Fatalf("/sys/fs/cgroup: want a read-write mount, got %+v", m)
	}
	if v := volume(spec, m.Name); v == nil || v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" {
		t.Errorf("/sys/fs/cgroup: want the node's /sys/fs/cgroup (hostPath), got %+v", v)
	}
	if got := envMap(c)["MCP_EXEC_RUNTIME"]; got != "libcontainer" {
		t.Errorf("MCP_EXEC_RUNTIME = %q, want libcontainer (fail rather than fall back)", got)
	}
}

func TestGVisorVariant(t *testing.T) {
	objs := loadManifests(t, "mcp-exec-gvisor.yaml")
	d, c := deployment(t, objs)
	spec := d.Spec.Template.Spec
	sc := c.SecurityContext

	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName: want gvisor")
	}
	rc := loadManifests(t, "runtimeclass-gvisor.yaml")
	if len(rc) != 1 || rc[0].(*nodev1.RuntimeClass).Name != "gvisor" || rc[0].(*nodev1.RuntimeClass).Handler != "runsc" {
		t.Errorf("runtimeclass-gvisor.yaml: want RuntimeClass gvisor with handler runsc, got %+v", rc)
	}
	for who, ps := range map[string]struct {
		nonRoot *bool
		uid     *int64
	}{
		"pod":       {spec.SecurityContext.RunAsNonRoot, spec.SecurityContext.RunAsUser},
		"container": {sc.RunAsNonRoot, sc.RunAsUser},
	} {
		if ps.nonRoot == nil || !*ps.nonRoot || ps.uid == nil || *ps.uid != 65532 {
			t.Errorf("%s: runAsNonRoot %s, runAsUser %s; want true and 65532", who, show(ps.nonRoot), show(ps.uid))
		}
	}
	if got := capNames(sc.Capabilities.Drop); !slices.Equal(got, []string{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities: drop %v, add %v; want drop [ALL], add nothing", got, sc.Capabilities.Add)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation: want false")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath; the gVisor variant takes nothing from the node", v.Name)
		}
	}
	if got := envMap(c)["MCP_EXEC_RUNTIME"]; got != "auto" {
		t.Errorf("MCP_EXEC_RUNTIME = %q, want auto (it resolves to process in the unprivileged pod)", got)
	}
}

// TestPodSecurityLevels runs the Pod Security admission checks the API
// server runs: the gVisor variant passes "restricted"; the privileged one
// fails "baseline" for exactly the privileges it is documented to need,
// so a new one shows up here.
func TestPodSecurityLevels(t *testing.T) {
	eval, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(file string, level psaapi.Level) []string {
		d, _ := deployment(t, loadManifests(t, file))
		results := eval.EvaluatePod(psaapi.LevelVersion{Level: level, Version: psaapi.LatestVersion()},
			&d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec)
		var reasons []string
		for _, r := range results {
			if !r.Allowed {
				reasons = append(reasons, r.ForbiddenReason+": "+r.ForbiddenDetail)
			}
		}
		sort.Strings(reasons)
		return reasons
	}

	if got := forbidden("mcp-exec-gvisor.yaml", psaapi.LevelRestricted); len(got) != 0 {
		t.Errorf("mcp-exec-gvisor.yaml under Pod Security restricted: forbidden %q, want none", got)
	}
	got := forbidden("mcp-exec.yaml", psaapi.LevelBaseline)
	want := []string{
		`forbidden AppArmor profile: container "mcp-exec" must not set AppArmor profile type to "Unconfined"`,
		`hostPath volumes: volume "cgroup"`,
		`non-default capabilities: container "mcp-exec" must not include "NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE" in securityContext.capabilities.add`,
		`seccompProfile: container "mcp-exec" must not set securityContext.seccompProfile.type to "Unconfined"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("mcp-exec.yaml under Pod Security baseline: forbidden\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func envMap(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func findEnv(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func mountOf(c *corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func capNames(caps []corev1.Capability) []string {
	var out []string
	for _, c := range caps {
		out = append(out, string(c))
	}
	sort.Strings(out)
	return out
}

// show prints what a pointer field holds, or "unset".
func show[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
