package localtok

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

func engineSays(ids []uint64) RemoteFunc {
	return func(context.Context) ([]uint64, error) { return ids, nil }
}

func statsOf(t *testing.T, s *Set, model string) Stats {
	t.Helper()
	for _, st := range s.Stats() {
		if st.Model == model {
			return st
		}
	}
	t.Fatalf("no stats for %q in %+v", model, s.Stats())
	return Stats{}
}

// TestSetFallsBackOnMismatches: the gateway holds another model's files
// than the engines. Every sampled check differs; after MismatchLimit of
// them the model's requests go remote, and the stats say where the first
// difference was.
func TestSetFallsBackOnMismatches(t *testing.T) {
	s := NewSet(map[string]*Model{"m": loadFixture(t, "chatml-other")}, Options{Sample: 1, MismatchLimit: 3}, nil)
	defer s.Close()
	req := parse(t, `{"model":"m","messages":[{"role":"user","content":"hello the world"}]}`)
	remote := engineSays(chatmlHelloIDs)
	sent := 0
	for !statsOf(t, s, "m").FellBack {
		ids, ok := s.Tokenize(req, remote)
		if !ok {
			break // fell back between the check and this request
		}
		if !slices.Equal(ids, otherHelloIDs) {
			t.Fatalf("local ids %v", ids)
		}
		if sent++; sent > 200 {
			t.Fatal("no fallback within 200 sampled requests")
		}
		testwait.For(t, 10*time.Second, "the check", func() bool { st := statsOf(t, s, "m"); return st.Checked+st.Dropped >= uint64(sent) })
	}
	st := statsOf(t, s, "m")
	if st.Mismatches != 3 || st.FirstMismatch == nil || st.FirstMismatch.Position != 0 ||
		st.FirstMismatch.Local != int64(otherHelloIDs[0]) || st.FirstMismatch.Engine != int64(chatmlHelloIDs[0]) {
		t.Fatalf("stats %+v, first mismatch %+v", st, st.FirstMismatch)
	}
	if _, ok := s.Tokenize(req, remote); ok {
		t.Fatal("tokenized locally after falling back")
	}
	if st := statsOf(t, s, "m"); st.FellBackRequests != 1 {
		t.Errorf("fell-back requests %d, want 1", st.FellBackRequests)
	}

	// A reload tries the local tokenizer again, counters carried over.
	next := NewSet(map[string]*Model{"m": loadFixture(t, "chatml-other")}, Options{Sample: 0}, s)
	defer next.Close()
	if _, ok := next.Tokenize(req, remote); !ok {
		t.Fatal("the next config did not try the local tokenizer again")
	}
	if st := statsOf(t, next, "m"); st.Mismatches != 3 || st.FellBack || st.Local != uint64(sent)+1 {
		t.Fatalf("carried stats %+v (sent %d)", st, sent)
	}
}

// TestSetMatchingEngine: checks that agree count as checked, nothing else.
func TestSetMatchingEngine(t *testing.T) {
	s := NewSet(map[string]*Model{AnyModel: loadFixture(t, "chatml")}, Options{Sample: 1, MismatchLimit: 1}, nil)
	defer s.Close()
	req := parse(t, `{"model":"whatever","prompt":"hello world"}`)
	for range 20 {
		if _, ok := s.Tokenize(req, engineSays(chatmlPromptIDs)); !ok {
			t.Fatal("not tokenized locally")
		}
	}
	testwait.For(t, 10*time.Second, "20 checks", func() bool { st := statsOf(t, s, AnyModel); return st.Checked+st.Dropped == 20 })
	if st := statsOf(t, s, AnyModel); st.Mismatches != 0 || st.FellBack || st.Local != 20 || st.Checked == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSetCheckOwnsItsIDs: a caller that reuses its buffer at once (as
// the fleet does) does not change what a sampled check compares.
func TestSetCheckOwnsItsIDs(t *testing.T) {
	s := NewSet(map[string]*Model{"m": loadFixture(t, "chatml")}, Options{Sample: 1, MismatchLimit: 1}, nil)
	defer s.Close()
	req := parse(t, `{"model":"m","prompt":"hello world"}`)
	buf := make([]uint64, 0, 64)
	for range 20 {
		ids, ok := s.AppendTokenize(buf[:0], req, engineSays(chatmlPromptIDs))
		if !ok || !slices.Equal(ids, chatmlPromptIDs) {
			t.Fatalf("AppendTokenize = %v, %v", ids, ok)
		}
		for i := range ids {
			ids[i] = 999 // the next request's ids
		}
	}
	testwait.For(t, 10*time.Second, "20 checks", func() bool { st := statsOf(t, s, "m"); return st.Checked+st.Dropped == 20 })
	if st := statsOf(t, s, "m"); st.Mismatches != 0 || st.Checked == 0 {
		t.Fatalf("stats %+v: the checks saw the reused buffer", st)
	}
}

// TestSetChecksAreBounded: a slow engine never holds requests; samples
// beyond the checker's queue are dropped, and a failing engine counts
// errors, not mismatches.
func TestSetChecksAreBounded(t *testing.T) {
	s := NewSet(map[string]*Model{"m": loadFixture(t, "chatml")}, Options{Sample: 1, MismatchLimit: 1, Timeout: time.Second}, nil)
	release := make(chan struct{})
	var calls atomic.Int64
	slow := func(ctx context.Context) ([]uint64, error) {
		calls.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, errors.New("engine down")
	}
	req := parse(t, `{"model":"m","prompt":"hello world"}`)
	start := time.Now()
	for range 100 {
		if _, ok := s.Tokenize(req, slow); !ok {
			t.Fatal("not tokenized locally")
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("100 requests took %v behind a stalled check", d)
	}
	close(release)
	testwait.For(t, 10*time.Second, "the queued checks", func() bool {
		st := statsOf(t, s, "m")
		return st.CheckErrors+st.Dropped == 100
	})
	st := statsOf(t, s, "m")
	if st.Dropped == 0 || st.Mismatches != 0 || st.FellBack {
		t.Fatalf("stats %+v", st)
	}
	s.Close()
	if n := calls.Load(); n > defaultQueue+1 {
		t.Fatalf("%d checks ran, at most the queue and the one in flight may", n)
	}
}

func TestSetUnknownModelIsRemote(t *testing.T) {
	s := NewSet(map[string]*Model{"m": loadFixture(t, "chatml")}, Options{}, nil)
	defer s.Close()
	if _, ok := s.Tokenize(parse(t, `{"model":"other","prompt":"x"}`), nil); ok {
		t.Fatal("a model without a local tokenizer was tokenized locally")
	}
	if _, ok := s.Tokenize(parse(t, `{"model":"m","prompt":[1,2]}`), nil); ok {
		t.Fatal("token ids were tokenized")
	}
	if st := statsOf(t, s, "m"); st.Remote != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b   []uint64
		differ bool
		want   Mismatch
	}{
		{a: []uint64{1, 2}, b: []uint64{1, 2}},
		{a: []uint64{1, 2}, b: []uint64{1, 3}, differ: true, want: Mismatch{Position: 1, Local: 2, Engine: 3, LocalTokens: 2, EngineTokens: 2}},
		{a: []uint64{1}, b: []uint64{1, 3}, differ: true, want: Mismatch{Position: 1, Local: -1, Engine: 3, LocalTokens: 1, EngineTokens: 2}},
		{a: []uint64{1, 2}, b: nil, differ: true, want: Mismatch{Position: 0, Local: 1, Engine: -1, LocalTokens: 2}},
	} {
		got, differ := compare(tc.a, tc.b)
		if differ != tc.differ || differ && got != tc.want {
			t.Errorf("compare(%v, %v) = %+v, %v", tc.a, tc.b, got, differ)
		}
	}
}

func TestCache(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/chatml", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var c Cache
	m1, err := c.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m2, _ := c.Load(dir); m2 != m1 {
		t.Fatal("an unchanged directory was loaded again")
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "tokenizer.json"), later, later); err != nil {
		t.Fatal(err)
	}
	m3, err := c.Load(dir)
	if err != nil || m3 == m1 {
		t.Fatalf("a changed directory was not loaded again (%v)", err)
	}
	c.Retain(nil)
	if m4, _ := c.Load(dir); m4 == m3 {
		t.Fatal("Retain kept a directory it was not given")
	}
	if _, err := c.Load(t.TempDir()); err == nil {
		t.Fatal("a directory without tokenizer.json loaded")
	}
}
