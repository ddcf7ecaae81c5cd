//go:build !unix

package proccpu

import (
	"errors"
	"time"
)

func self() (time.Duration, error) {
	return 0, errors.New("proccpu: no CPU time of the process on this system")
}
