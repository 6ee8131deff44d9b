package runtime

import (
	"context"
	"fmt"
)

// NewRunsc is not available yet.
func NewRunsc(cfg Config) (Runtime, error) {
	return nil, fmt.Errorf("%w: the runsc runtime is not implemented in this build", ErrUnsupported)
}

// RunscInfo is what doctor reports of runsc.
type RunscInfo struct {
	Path     string   `json:"path,omitempty"`
	Version  string   `json:"version,omitempty"`
	Platform string   `json:"platform,omitempty"`
	Missing  []string `json:"missing,omitempty"`
}

func (i RunscInfo) Available() bool { return len(i.Missing) == 0 }
func (i RunscInfo) Detail() string {
	if i.Path == "" {
		return ""
	}
	return fmt.Sprintf("%s %s, platform %s", i.Path, i.Version, i.Platform)
}

// ProbeRunsc finds runsc and the platform it would use.
func ProbeRunsc(ctx context.Context, path, platform string) RunscInfo {
	return RunscInfo{Missing: []string{"the runsc runtime is not implemented in this build"}}
}
