// Package blas selects the BLAS that gorgonia runs on. The default build
// links OpenBLAS through cgo for single-precision matrix products (Sgemm,
// the only routine that matters for an MLP) and leaves every other routine
// to gonum's pure-Go implementation. Build with -tags purego for a binary
// without cgo or OpenBLAS.
//
// OpenBLAS is limited to one thread per process by default: pstrain runs
// several processes on few cores, and oversubscribing them costs more than
// it gains.
package blas
