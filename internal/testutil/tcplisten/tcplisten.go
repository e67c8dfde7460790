// Package tcplisten counts the sockets listening on a TCP port, from
// Linux's /proc/net/tcp and /proc/net/tcp6.
//
// Tests need it around Caddy's config reloads: Caddy binds each new
// config's listener with SO_REUSEPORT while the old config's is still
// open, and its /load answers once the old server has begun shutting
// down, not once its listener is closed. Until then the kernel spreads new
// connections over both sockets, and resets the ones queued on the old
// socket when it closes. A test that sends a request on a fresh connection
// right after a reload waits for one listener first.
package tcplisten

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

// listenState is TCP_LISTEN in /proc/net/tcp's "st" column.
const listenState = "0A"

// maxLines bounds the lines read from one table: a test machine has far
// fewer sockets.
const maxLines = 1 << 20

// Count returns how many sockets listen on port, over IPv4 and IPv6.
// ok is false where /proc/net/tcp cannot be read (not Linux, or no
// procfs): the count is unknown then.
func Count(port int) (n int, ok bool, err error) {
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		c, err := countIn(table, port)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		n, ok = n+c, true
	}
	return n, ok, nil
}

// countIn counts the listening sockets on port in one /proc table.
func countIn(table string, port int) (int, error) {
	f, err := os.Open(table)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	n, lines := 0, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if lines++; lines > maxLines {
			return 0, fmt.Errorf("%s: more than %d lines", table, maxLines)
		}
		// sl local_address rem_address st ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != listenState {
			continue
		}
		if strings.HasSuffix(fields[1], want) {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", table, err)
	}
	return n, nil
}

// WaitOne waits until exactly one socket listens on each of ports, or ctx
// ends. Where the count is unknown it returns at once: the caller's
// requests may then meet the reload race this package exists for.
func WaitOne(ctx context.Context, ports ...int) error {
	for _, port := range ports {
		for {
			n, ok, err := Count(port)
			if err != nil {
				return err
			}
			if !ok || n == 1 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("port %d: still %d listeners: %w", port, n, context.Cause(ctx))
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}
