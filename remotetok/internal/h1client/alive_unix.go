//go:build unix

package h1client

import (
	"errors"
	"net"
	"syscall"
)

// connAlive peeks at nc's socket without blocking: nothing to read means
// the connection is open and quiet; an end of stream, a byte nobody asked
// for, or an error means it cannot carry a call.
func connAlive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true // not a socket (a test's pipe): nothing to peek at
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
		return true // never wait for readability
	})
	return err == nil && alive
}
