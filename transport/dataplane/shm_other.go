//go:build !linux

package dataplane

import (
	"errors"
	"io"
	"net"
	"time"
)

// Off Linux there is no same-host socket, hence no region.

func unmap([]byte) {}

func offerRegion(*net.UnixConn, int, time.Time) ([]byte, sharedSnaps, byte, error) {
	return nil, sharedSnaps{}, regionDisabled, nil
}

func (s *Server) takeRegion(c *net.UnixConn) ([]byte, bool, io.Reader, bool) {
	return nil, false, c, true
}

func newServerSnapshots(int) (*snapshots, int, error) { return nil, -1, errors.New("no shared memory") }

func closeSnapshots(*snapshots, int) {}

func (s *Server) releaseRegion([]byte) {}

func serverUID() int { return -1 }
