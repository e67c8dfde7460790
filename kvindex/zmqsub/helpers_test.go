package zmqsub

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/pyzmq"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pyPeer is a running testdata/zmqpeer.py process.
type pyPeer struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
	once   sync.Once
}

func startPeer(t testing.TB, args ...string) *pyPeer {
	t.Helper()
	cmd := exec.Command(pyzmq.Require(t), append([]string{"testdata/zmqpeer.py"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &pyPeer{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16), stderr: new(bytes.Buffer)}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(p.kill)
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// line waits for the next stdout line.
func (p *pyPeer) line(timeout time.Duration) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("zmqpeer.py exited; stderr: %s", p.stderr)
		}
		return l
	case <-time.After(timeout):
		p.t.Fatalf("zmqpeer.py: no output within %v", timeout)
	}
	return ""
}

// port reads the "PORT n" line.
func (p *pyPeer) port() int {
	p.t.Helper()
	l := p.line(10 * time.Second)
	var n int
	if _, err := fmt.Sscanf(l, "PORT %d", &n); err != nil {
		p.t.Fatalf("zmqpeer.py: want PORT, got %q", l)
	}
	return n
}

// do sends one command and returns its reply line.
func (p *pyPeer) do(cmd string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("zmqpeer.py %q: %v", cmd, err)
	}
	return p.line(20 * time.Second)
}

// kill stops the process at once (like kill -9 of an engine).
func (p *pyPeer) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		for range p.lines {
		}
	})
}

// payloadFor mirrors zmqpeer.py's payload(seq, size).
func payloadFor(seq uint64, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte((seq + uint64(i)) % 251)
	}
	return b
}

type event struct {
	kind    string // "connected", "message", "disconnected"
	topic   string
	seq     uint64
	payload []byte
	err     error
	at      time.Time
}

// recorder is a Handler that records events on a channel.
type recorder struct {
	ch chan event
}

func newRecorder() *recorder { return &recorder{ch: make(chan event, 1<<16)} }

func (r *recorder) Connected() { r.ch <- event{kind: "connected", at: time.Now()} }
func (r *recorder) Message(topic []byte, seq uint64, payload []byte) {
	r.ch <- event{kind: "message", topic: string(topic), seq: seq, payload: payload, at: time.Now()}
}
func (r *recorder) Disconnected(err error) {
	r.ch <- event{kind: "disconnected", err: err, at: time.Now()}
}

func (r *recorder) next(t testing.TB, timeout time.Duration) event {
	t.Helper()
	select {
	case e := <-r.ch:
		return e
	case <-time.After(timeout):
		t.Fatalf("no handler event within %v", timeout)
	}
	return event{}
}

// expect waits for the next event and checks its kind.
func (r *recorder) expect(t testing.TB, kind string, timeout time.Duration) event {
	t.Helper()
	e := r.next(t, timeout)
	if e.kind != kind {
		t.Fatalf("want %s event, got %s (seq %d, err %v)", kind, e.kind, e.seq, e.err)
	}
	return e
}

// running is a Subscriber running in the background.
type running struct {
	s    *Subscriber
	rec  *recorder
	stop func()
}

func startRun(t testing.TB, cfg Config) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, rec) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v after cancel, want nil", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Run did not return within 5s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &running{s: s, rec: rec, stop: stop}
}

func tcpEP(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }

func hasPrefix(s, p string) bool { return strings.HasPrefix(s, p) }
