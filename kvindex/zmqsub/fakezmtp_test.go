package zmqsub

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/zmtpwire"
	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// Hand-written ZMTP 3.0 wire pieces for fake peers (internal/testutil/zmtpwire).

// The wire constants, under the names these tests knew before the ZMTP
// code moved to internal/zmtp.
const (
	greetingLen = zmtp.GreetingLen
	flagMore    = zmtp.FlagMore
	flagLong    = zmtp.FlagLong
	flagCommand = zmtp.FlagCommand

	maxKeptBuffer = zmtp.MaxKeptBuffer
)

var (
	zmtpGreeting = zmtpwire.Greeting
	zmtpFrame    = zmtpwire.Frame
	zmtpCommand  = zmtpwire.Command
	zmtpProp     = zmtpwire.Prop
	zmtpReady    = zmtpwire.Ready
	zmtpMessage  = zmtpwire.Message
	seqBytes     = zmtpwire.Seq
)

// readFrame reads one ZMTP frame (for consuming the client's READY).
func readFrame(r io.Reader) (flags byte, body []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:2]); err != nil {
		return 0, nil, err
	}
	size := uint64(h[1])
	if h[0]&flagLong != 0 {
		if _, err := io.ReadFull(r, h[2:9]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if size > 1<<20 {
		return 0, nil, io.ErrShortBuffer
	}
	body = make([]byte, size)
	_, err = io.ReadFull(r, body)
	return h[0], body, err
}

// serverHandshake plays a ZMTP 3.0 NULL server with the given READY bytes.
func serverHandshake(c net.Conn, ready []byte) error {
	if _, err := c.Write(zmtpGreeting("NULL", 3)); err != nil {
		return err
	}
	var g [greetingLen]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return err
	}
	if _, err := c.Write(ready); err != nil {
		return err
	}
	_, _, err := readFrame(c) // the client's READY
	return err
}

// fakeServer accepts TCP connections on 127.0.0.1 and runs serve on each
// until the test ends. Connections are closed and goroutines joined at
// cleanup.
func fakeServer(t testing.TB, serve func(c net.Conn)) (addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// holdOpen keeps a fake connection open until the peer or the test closes it.
func holdOpen(c net.Conn) {
	_ = c.SetReadDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, c)
}
