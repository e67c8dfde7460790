package kvindex_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/pyzmq"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/kvindex/zmqsub"
)

// pyPublisher drives testdata/vllm_publisher.py: vLLM-format batches
// encoded by Python's msgpack on real libzmq, independent of the Go side.
type pyPublisher struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	lines   chan string
	pubPort int
	replay  int
}

func startPublisher(t *testing.T, args ...string) *pyPublisher {
	t.Helper()
	cmd := exec.Command(pyzmq.Require(t), append([]string{"testdata/vllm_publisher.py"}, args...)...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPublisher{t: t, cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(p.kill)
	if _, err := fmt.Sscanf(p.line(), "PORTS %d %d", &p.pubPort, &p.replay); err != nil {
		t.Fatalf("publisher did not report its ports: %v", err)
	}
	return p
}

func (p *pyPublisher) line() string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatal("publisher exited")
		}
		return l
	case <-time.After(10 * time.Second):
		p.t.Fatal("publisher did not answer")
	}
	return ""
}

// do sends one command and returns the answer.
func (p *pyPublisher) do(cmd string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		p.t.Fatalf("%s: %v", cmd, err)
	}
	return p.line()
}

func (p *pyPublisher) kill() {
	_ = p.in.Close()
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// chainTokens are the tokens the publisher stores for a chain of n blocks
// starting at first.
func chainTokens(first, n int) []uint64 {
	out := make([]uint64, n*16)
	for i := range out {
		out[i] = uint64(first + i)
	}
	return out
}

// TestLibzmqInterop mirrors a real libzmq publisher exactly: both event
// shapes and both hash encodings (mixed in one stream), a removal, a gap
// filled from the replay ROUTER, a gap beyond the replay buffer (reset), a
// publisher restart (reset and resubscribe) and AllBlocksCleared.
func TestLibzmqInterop(t *testing.T) {
	pub := startPublisher(t, "--buffer", "4")

	ix := kvindex.NewIndex(kvindex.IndexConfig{})
	m, err := ix.AddEngine("engine", kvindex.MirrorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", pub.replay)
	feed := kvindex.NewFeed(m, func(ctx context.Context, start uint64, fn func(uint64, []byte) error) error {
		return zmqsub.Replay(ctx, replayEP, start, 0, fn)
	}, kvindex.FeedConfig{})
	defer feed.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = zmqsub.Run(ctx, zmqsub.Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pub.pubPort)}, feed)
	}()
	defer func() { cancel(); wg.Wait() }()

	matched := func(first, n int) int {
		res, err := ix.Match(kvindex.Query{Tokens: chainTokens(first, n)})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Engine == "engine" {
				return r.Blocks
			}
		}
		return 0
	}
	// waitSeq waits until the mirror applied seq, then checks each chain.
	type want struct{ first, n, blocks int }
	check := func(step string, seq uint64, wants ...want) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := m.Stats()
			if st.HasSeq && st.LastSeq >= seq {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: mirror did not reach seq %d: %+v", step, seq, st)
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, w := range wants {
			if got := matched(w.first, w.n); got != w.blocks {
				t.Errorf("%s: chain at %d holds %d blocks, want %d", step, w.first, got, w.blocks)
			}
		}
	}
	if got := pub.do("waitsub"); got != "SUB" {
		t.Fatalf("waitsub: %q", got)
	}

	pub.do("store A 4 0 array int")                      // seq 0
	pub.do("store B 3 1000 map bytes")                   // seq 1
	check("stored", 1, want{0, 4, 4}, want{1000, 3, 3})  //
	pub.do("remove A 3 map int")                         // seq 2: map removal of an array/int block
	pub.do("remove B 2 array int")                       // seq 3: int removal of a bytes-announced block
	check("removed", 3, want{0, 4, 3}, want{1000, 3, 2}) //

	// A lost message within the replay buffer: filled, no reset.
	pub.do("drop")
	pub.do("store C 2 2000 array bytes") // seq 4, lost
	pub.do("store D 2 3000 map int")     // seq 5: gap 4 -> replay
	check("gap filled", 5, want{0, 4, 3}, want{2000, 2, 2}, want{3000, 2, 2})
	st := m.Stats()
	if st.Resyncs["gap"] != 0 || st.GapsFilled == 0 {
		t.Errorf("gap within the buffer: resyncs %v, gaps filled %d", st.Resyncs, st.GapsFilled)
	}

	// Lost messages beyond the replay buffer (4 batches): reset, then apply.
	pub.do("drop")
	pub.do("store E 1 4000 array int") // seq 6, lost
	for i := range 5 {                 // seqs 7-11, lost: seq 6 leaves the buffer
		pub.do("drop")
		pub.do(fmt.Sprintf("store F%d 1 %d array int", i, 5000+100*i))
	}
	pub.do("store G 2 6000 array int") // seq 12
	check("gap beyond buffer", 12, want{0, 4, 0}, want{6000, 2, 2})
	if m.Stats().Resyncs["gap"] == 0 {
		t.Errorf("gap beyond the buffer did not reset: %v", m.Stats().Resyncs)
	}

	// Publisher restart on the same ports: sequence back to 0, reset.
	pubPort, replayPort := pub.pubPort, pub.replay
	pub.kill()
	eventually := time.Now().Add(10 * time.Second)
	for m.Stats().Connected {
		if time.Now().After(eventually) {
			t.Fatal("subscriber did not notice the publisher going away")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pub = startPublisher(t, "--buffer", "4", "--pub-port", fmt.Sprint(pubPort), "--replay-port", fmt.Sprint(replayPort))
	eventually = time.Now().Add(10 * time.Second)
	if got := pub.do("waitsub"); got != "SUB" {
		t.Fatalf("waitsub after restart: %q", got)
	}
	// The publisher sees the subscription as the dial completes, a
	// moment before the subscriber starts its session (Feed.Connected).
	// Until then the mirror's stats still show the old session's last
	// seq (12), which would satisfy the checks below before a message of
	// the new process is applied: wait for the new session first. (Its
	// messages are applied only after Connected, in order.)
	for !m.Stats().Connected {
		if time.Now().After(eventually) {
			t.Fatal("subscriber did not reconnect to the restarted publisher")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := matched(6000, 2); got != 0 {
		t.Errorf("after the restart the mirror still claims %d blocks of G", got)
	}
	pub.do("store H 3 7000 map bytes") // seq 0 of the new process
	check("after restart", 0, want{7000, 3, 3}, want{6000, 2, 0})

	pub.do("clear") // seq 1
	check("cleared", 1, want{7000, 3, 0})
	if st := m.Stats(); st.Blocks != 0 || st.Resyncs["cleared"] == 0 {
		t.Errorf("after AllBlocksCleared: %d blocks, resyncs %v", st.Blocks, st.Resyncs)
	}
}
