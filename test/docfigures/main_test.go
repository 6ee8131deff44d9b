package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	perf := filepath.Join(dir, "performance.md")
	os.WriteFile(readme, []byte("# x\n\n## Performance\n\ntext\n\n| row | a | b |\n|---|---|---|\n| 20,000 calls | 9.6 ms (0.34×) | 19.65 ms |\n\n## Next\n| not | 77 |\n"), 0o644)
	os.WriteFile(perf, []byte("figures: 9.6 ms, 0.34× and 119.65 ms\n"), 0o644)
	missing, err := check(readme, perf)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || !strings.Contains(missing[0], `"19.65"`) {
		t.Errorf("missing = %q, want only 19.65 (20,000 is a row label; 77 is not in the table)", missing)
	}
}
