package routing

import (
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestBreakerDefaults(t *testing.T) {
	b := NewBreaker(BreakerConfig{})
	if b.cfg != (BreakerConfig{Failures: 5, Window: time.Minute, Cooldown: 10 * time.Second}) {
		t.Fatalf("defaults %+v", b.cfg)
	}
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 3, Cooldown: 10 * time.Second})
	const d = "a:1"
	for i := range 2 {
		b.Failure(d, at(time.Duration(i)*time.Second))
		if !b.Allow(d, at(time.Duration(i)*time.Second)) || b.State(d, at(0)) != StateClosed {
			t.Fatalf("open after %d failures", i+1)
		}
	}
	b.Failure(d, at(2*time.Second))
	if b.Allow(d, at(2*time.Second)) || b.State(d, at(2*time.Second)) != StateOpen {
		t.Fatal("not open after 3 consecutive failures")
	}
	if got := b.Open(at(3 * time.Second)); !slices.Equal(got, []string{d}) {
		t.Fatalf("Open = %v", got)
	}
	if b.State("other:1", at(3*time.Second)) != StateClosed || !b.Allow("other:1", at(3*time.Second)) {
		t.Fatal("breakers are per dial")
	}
	// Still open just before the cooldown ends; stragglers do not extend it.
	b.Failure(d, at(11*time.Second))
	b.Success(d, at(11*time.Second))
	if b.Allow(d, at(11999*time.Millisecond)) {
		t.Fatal("allowed during cooldown")
	}
	if b.State(d, at(12*time.Second)) != StateHalfOpen {
		t.Fatalf("state after cooldown %s, want half_open", b.State(d, at(12*time.Second)))
	}
}

func TestBreakerSuccessResetsStreak(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 3})
	const d = "a:1"
	for i := range 10 {
		now := at(time.Duration(i) * time.Second)
		b.Failure(d, now)
		b.Failure(d, now)
		b.Success(d, now)
		if b.State(d, now) != StateClosed {
			t.Fatalf("round %d: opened although every streak was 2 < 3", i)
		}
	}
	if len(b.dials) != 0 {
		t.Fatalf("closed breakers kept %d entries", len(b.dials))
	}
}

func TestBreakerWindow(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 3, Window: time.Minute})
	const d = "a:1"
	b.Failure(d, at(0))
	b.Failure(d, at(30*time.Second))
	b.Failure(d, at(61*time.Second)) // the streak began over a Window ago: starts afresh
	if b.State(d, at(61*time.Second)) != StateClosed {
		t.Fatal("failures spread over more than Window opened the breaker")
	}
	b.Failure(d, at(70*time.Second))
	b.Failure(d, at(80*time.Second))
	if b.State(d, at(80*time.Second)) != StateOpen {
		t.Fatal("3 failures within Window did not open the breaker")
	}
}

func TestBreakerHalfOpen(t *testing.T) {
	cool := 10 * time.Second
	open := func() *Breaker {
		b := NewBreaker(BreakerConfig{Failures: 1, Cooldown: cool})
		b.Failure("a:1", at(0))
		return b
	}
	t.Run("single probe then close on success", func(t *testing.T) {
		b := open()
		if !b.Allow("a:1", at(cool)) {
			t.Fatal("probe not allowed after cooldown")
		}
		if b.Allow("a:1", at(cool)) || b.Allow("a:1", at(cool+time.Second)) {
			t.Fatal("second concurrent probe allowed")
		}
		b.Success("a:1", at(cool+2*time.Second))
		if b.State("a:1", at(cool+2*time.Second)) != StateClosed || !b.Allow("a:1", at(cool+2*time.Second)) {
			t.Fatal("not closed after successful probe")
		}
		if len(b.Open(at(cool+2*time.Second))) != 0 {
			t.Fatal("still listed as open")
		}
	})
	t.Run("probe failure reopens for a full cooldown", func(t *testing.T) {
		b := open()
		b.Allow("a:1", at(cool))
		b.Failure("a:1", at(cool+time.Second))
		if b.State("a:1", at(cool+time.Second)) != StateOpen {
			t.Fatal("not reopened")
		}
		if b.Allow("a:1", at(2*cool)) {
			t.Fatal("allowed before the new cooldown ended")
		}
		if !b.Allow("a:1", at(2*cool+time.Second)) {
			t.Fatal("no probe after the new cooldown")
		}
	})
	t.Run("released probe is available again", func(t *testing.T) {
		b := open()
		b.Allow("a:1", at(cool))
		b.Release("a:1")
		if !b.Allow("a:1", at(cool)) {
			t.Fatal("released probe not available")
		}
	})
	t.Run("unanswered probe expires after a cooldown", func(t *testing.T) {
		b := open()
		b.Allow("a:1", at(cool))
		if b.Allow("a:1", at(2*cool-time.Millisecond)) {
			t.Fatal("probe expired early")
		}
		if !b.Allow("a:1", at(2*cool)) {
			t.Fatal("lost probe wedged the breaker")
		}
	})
}

// TestBreakerConcurrent: exactly one of many concurrent callers gets the
// half-open probe (run with -race).
func TestBreakerConcurrent(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 1, Cooldown: time.Second})
	b.Failure("a:1", at(0))
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 16 {
		wg.Go(func() {
			if b.Allow("a:1", at(time.Second)) {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
			b.State("a:1", at(time.Second))
			b.Open(at(time.Second))
		})
	}
	wg.Wait()
	if allowed != 1 {
		t.Fatalf("%d probes allowed, want 1", allowed)
	}
}

func TestBreakerReset(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 2})
	const d = "a:1"
	if b.Reset(d, at(0)) {
		t.Fatal("Reset of a closed breaker reported it open")
	}
	b.Failure(d, at(0))
	b.Failure(d, at(0))
	if !b.Reset(d, at(time.Second)) || b.State(d, at(time.Second)) != StateClosed {
		t.Fatalf("Reset of an open breaker: state %s", b.State(d, at(time.Second)))
	}
	b.Failure(d, at(2*time.Second)) // the streak started afresh
	if b.State(d, at(2*time.Second)) != StateClosed || len(b.dials) != 1 {
		t.Fatalf("one failure after Reset: state %s", b.State(d, at(2*time.Second)))
	}
}

// TestBreakerAdmits: Admits answers as Allow would — yes when closed, no
// while open, one probe when half-open until one is claimed (and again
// once it goes unanswered for a cooldown) — and claims nothing itself.
func TestBreakerAdmits(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 1, Cooldown: 10 * time.Second})
	const d = "a:1"
	if ok, probe := b.Admits(d, at(0)); !ok || probe {
		t.Fatalf("closed: Admits = %v, %v; want true, false", ok, probe)
	}
	b.Failure(d, at(0))
	if ok, _ := b.Admits(d, at(9*time.Second)); ok {
		t.Fatal("open: Admits = true")
	}
	for range 2 { // asking twice claims nothing
		if ok, probe := b.Admits(d, at(10*time.Second)); !ok || !probe {
			t.Fatalf("half-open: Admits = %v, %v; want true, true", ok, probe)
		}
	}
	if !b.Allow(d, at(10*time.Second)) {
		t.Fatal("Admits claimed the probe")
	}
	if ok, _ := b.Admits(d, at(15*time.Second)); ok {
		t.Fatal("half-open with the probe out: Admits = true")
	}
	if ok, probe := b.Admits(d, at(20*time.Second)); !ok || !probe {
		t.Fatalf("probe unanswered for a cooldown: Admits = %v, %v; want true, true", ok, probe)
	}
}
