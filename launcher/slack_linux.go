package launcher

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// errNoSlack is never returned here (see slack_other.go).
var errNoSlack = errors.New("timer slack is set only on Linux")

// setTimerSlack sets the calling thread's timer slack.
func setTimerSlack(d time.Duration) error {
	return unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(d.Nanoseconds()), 0, 0, 0)
}

// timerSlack is the calling thread's timer slack.
func timerSlack() (time.Duration, error) {
	ns, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	return time.Duration(ns), err
}
