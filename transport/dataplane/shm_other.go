//go:build !linux

package dataplane

import (
	"io"
	"net"
	"time"
)

// Off Linux there is no same-host socket, hence no region.

func unmap([]byte) {}

func offerRegion(*net.UnixConn, int, time.Time) ([]byte, byte, error) {
	return nil, regionDisabled, nil
}

func (s *Server) takeRegion(c *net.UnixConn) ([]byte, io.Reader, bool) { return nil, c, true }

func (s *Server) releaseRegion([]byte) {}

func serverUID() int { return -1 }
