package image

import (
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// A layout whose name leads to two different images is refused, as the
// operator must say which; the same image named twice is that image.
func TestPickManifestByName(t *testing.T) {
	a, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	named := func(imgs ...v1.Image) v1.ImageIndex {
		idx := v1.ImageIndex(empty.Index)
		for _, img := range imgs {
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
				Descriptor: v1.Descriptor{Annotations: map[string]string{annotationRefName: "py"}}})
		}
		return idx
	}
	if _, err := pickManifest(named(a, b), "/l", "py"); err == nil || !strings.Contains(err.Error(), "2 different images named py") {
		t.Errorf("two images named py: err %v, want a refusal naming them", err)
	}
	d, err := pickManifest(named(a, a), "/l", "py")
	want, _ := a.Digest()
	if err != nil || d.Digest != want {
		t.Errorf("one image named py twice: %v %v, want it", d.Digest, err)
	}
}
