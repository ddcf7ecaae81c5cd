//go:build !linux

package launcher

import (
	"errors"
	"time"
)

var errNoSlack = errors.New("timer slack is set only on Linux")

func setTimerSlack(time.Duration) error { return errNoSlack }

func timerSlack() (time.Duration, error) { return 0, errNoSlack }
