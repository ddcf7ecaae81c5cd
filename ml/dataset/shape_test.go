package dataset

import (
	"testing"

	"github.com/pstrain/pstrain/internal/testbin"
)

// Shape says what Load finds, for the data set the tests have.
func TestShapeIsWhatLoadReads(t *testing.T) {
	dir := testbin.MNIST(t)
	// mnist-x4 is MNIST's images transformed (Augment keeps Dim and
	// Classes); fashion-mnist is not fetched for the tests.
	for _, name := range []string{"mnist"} {
		_, test, err := Load(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		dim, classes, ok := NamedShape(name)
		if !ok || dim != test.Dim || classes != test.Classes {
			t.Errorf("%s: Shape %d, %d, %v; Load read %d, %d", name, dim, classes, ok, test.Dim, test.Classes)
		}
	}
	if _, _, ok := NamedShape("idx:a,b,c,d"); ok {
		t.Error("Shape knows the shape of an idx: data set it has not read")
	}
}
