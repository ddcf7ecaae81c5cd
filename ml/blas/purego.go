//go:build !cgo || purego

package blas

import (
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
)

// Name says which BLAS this binary uses.
const Name = "gonum"

// Describe names the BLAS: gonum's has no kernels to choose.
func Describe() string { return Name }

// Check reports nothing: gonum's BLAS is always there.
func Check() error { return nil }

// Setup makes gorgonia use gonum's pure-Go BLAS; threads is ignored and
// it never fails.
func Setup(threads int) error {
	gorgonia.Use(gonum.Implementation{})
	return nil
}
