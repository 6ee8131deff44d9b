package runtime

import (
	"strings"
	"testing"
)

// What the probe finds becomes what each call gets and what the host
// lacks, named for the log, the tool's description and doctor.
func TestReadProbe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		line     string
		root     bool
		landlock int
		seccomp  bool
		missing  []string
	}{
		{"everything, root", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=0\n", true, 7, true, nil},
		{"everything, unprivileged", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=0\n", false, 7, true, []string{"a uid per call"}},
		{"no Landlock", "landlock=0 subreaper=0 nnp=0 seccomp=0\n", true, 0, true, []string{"Landlock"}},
		{"Landlock refused by a profile", "landlock=7 subreaper=0 nnp=0 restrict=1 seccomp=0\n", true, 0, true, []string{"a Landlock domain"}},
		{"no scoping", "landlock=5 subreaper=0 nnp=0 restrict=0 seccomp=0\n", true, 5, true, []string{"Landlock scoping (ABI 6)"}},
		{"no seccomp", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=22\n", true, 7, false, []string{"seccomp"}},
		{"no subreaper", "landlock=7 subreaper=1 nnp=0 restrict=0 seccomp=0\n", true, 7, true, []string{"the child subreaper"}},
		{"nothing said", "", false, 0, false, []string{"Landlock", "seccomp", "the child subreaper", "a uid per call"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			iso := readProbe([]byte(tc.line), 65532, tc.root)
			var names []string
			for _, m := range iso.Missing {
				names = append(names, m.What)
				if m.Why == "" || m.Fix == "" {
					t.Errorf("%s: missing %q says no why or fix", tc.name, m.What)
				}
			}
			if iso.Landlock != tc.landlock || iso.Seccomp != tc.seccomp || strings.Join(names, ",") != strings.Join(tc.missing, ",") {
				t.Errorf("readProbe(%q) = Landlock %d, seccomp %v, missing %v; want %d, %v, %v", tc.line, iso.Landlock, iso.Seccomp, names, tc.landlock, tc.seccomp, tc.missing)
			}
		})
	}
}
