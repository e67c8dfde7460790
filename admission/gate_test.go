package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

func newTestGate(cfg Config) (*Gate, *testclock.Clock) {
	clk := testclock.New(time.Unix(1_000_000, 0))
	return NewGateClock(cfg, clk.Now), clk
}

// capacity is a counting semaphore standing in for engine slots.
type capacity struct {
	mu    sync.Mutex
	free  int
	calls int
}

func (c *capacity) try() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.free > 0 {
		c.free--
		return true
	}
	return false
}

func (c *capacity) release(n int) {
	c.mu.Lock()
	c.free += n
	c.mu.Unlock()
}

func isReady(w *Waiter) bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

func mustEnter(t *testing.T, g *Gate, b Band, try TryFunc) *Waiter {
	t.Helper()
	w, err := g.Enter(b, try)
	if err != nil {
		t.Fatalf("Enter(%v): %v", b, err)
	}
	return w
}

func TestParseBand(t *testing.T) {
	tests := []struct {
		in   string
		want Band
		ok   bool
	}{
		{"high", High, true}, {"HIGH", High, true}, {" Normal ", Normal, true}, {"low", Low, true},
		{"0", High, true}, {"1", Normal, true}, {"2", Low, true},
		{"3", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"01", 0, false},
		{"", 0, false}, {"medium", 0, false}, {"hi", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseBand(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseBand(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	for b := High; b < NumBands; b++ {
		if got, ok := ParseBand(b.String()); !ok || got != b {
			t.Errorf("ParseBand(%v.String()) = %v, %v", b, got, ok)
		}
	}
	if s := Band(7).String(); s != "band(7)" {
		t.Errorf("Band(7).String() = %q", s)
	}
}

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		in, want Config
	}{
		{Config{}, Config{QueueSize: DefaultQueueSize, Aging: DefaultAging}},
		{Config{QueueSize: 5, Aging: time.Second}, Config{QueueSize: 5, Aging: time.Second}},
		{Config{QueueSize: -1, Aging: -1}, Config{QueueSize: -1, Aging: -1}},
		{Config{QueueSize: -7, Aging: -time.Second}, Config{QueueSize: -1, Aging: -1}},
	}
	for _, tt := range tests {
		g := NewGate(tt.in)
		if got := g.Config(); got != tt.want {
			t.Errorf("NewGate(%+v).Config() = %+v, want %+v", tt.in, got, tt.want)
		}
		g.SetConfig(g.Config())
		if got := g.Config(); got != tt.want {
			t.Errorf("Config round trip of %+v gave %+v", tt.in, got)
		}
	}
}

func TestEnterFastPath(t *testing.T) {
	g, clk := newTestGate(Config{})
	c := &capacity{free: 1}
	w := mustEnter(t, g, Normal, c.try)
	if !isReady(w) {
		t.Fatal("fast-path waiter not ready")
	}
	clk.Advance(time.Second)
	if p := w.Position(); p != 0 {
		t.Errorf("Position = %d, want 0", p)
	}
	if d := w.Waited(); d != 0 {
		t.Errorf("Waited = %v, want 0", d)
	}
	if w.Band() != Normal {
		t.Errorf("Band = %v", w.Band())
	}
	if !w.Leave() || !w.Leave() {
		t.Error("Leave after admission must report admitted")
	}
	s := g.Stats()
	if s.Admitted[Normal] != 1 || s.Parked[Normal] != 0 || s.Depth[Normal] != 0 || s.Abandoned[Normal] != 0 {
		t.Errorf("stats = %+v", s)
	}
	if c.free != 0 {
		t.Errorf("capacity not reserved: free = %d", c.free)
	}
}

func TestEnterInvalid(t *testing.T) {
	g := NewGate(Config{})
	if _, err := g.Enter(Band(3), func() bool { return true }); err == nil {
		t.Error("invalid band accepted")
	}
	if _, err := g.Enter(Band(-1), func() bool { return true }); err == nil {
		t.Error("negative band accepted")
	}
	if _, err := g.Enter(High, nil); err == nil {
		t.Error("nil TryFunc accepted")
	}
}

func TestParkAndKick(t *testing.T) {
	g, clk := newTestGate(Config{})
	c := &capacity{}
	w := mustEnter(t, g, Low, c.try)
	if isReady(w) {
		t.Fatal("parked waiter is ready")
	}
	if p := w.Position(); p != 1 {
		t.Errorf("Position = %d, want 1", p)
	}
	clk.Advance(3 * time.Second)
	if d := w.Waited(); d != 3*time.Second {
		t.Errorf("Waited = %v", d)
	}
	if n := g.kick(); n != 0 || isReady(w) {
		t.Fatalf("Kick without capacity admitted %d", n)
	}
	c.release(1)
	if n := g.kick(); n != 1 || !isReady(w) {
		t.Fatalf("Kick with capacity admitted %d, ready=%v", n, isReady(w))
	}
	clk.Advance(time.Second)
	if d := w.Waited(); d != 3*time.Second {
		t.Errorf("Waited after admission = %v, want 3s (frozen at admission)", d)
	}
	if w.Position() != 0 || !w.Leave() {
		t.Error("admitted waiter: want Position 0 and Leave true")
	}
	s := g.Stats()
	if s.Admitted[Low] != 1 || s.Parked[Low] != 1 || s.Depth[Low] != 0 {
		t.Errorf("stats = %+v", s)
	}
}

// TestKickWakesBlockedGoroutine checks that Ready is a real wakeup for a
// goroutine blocked on it, as the handler will be.
func TestKickWakesBlockedGoroutine(t *testing.T) {
	g := NewGate(Config{})
	c := &capacity{}
	w := mustEnter(t, g, Normal, c.try)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-w.Ready()
	}()
	c.release(1)
	g.Kick()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter goroutine not woken")
	}
}

func TestWaiterWait(t *testing.T) {
	g := NewGate(Config{})
	c := &capacity{}
	w := mustEnter(t, g, Normal, c.try)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a cancelled context = %v", err)
	}
	if d := g.Stats().Depth[Normal]; d != 0 {
		t.Errorf("depth after cancelled Wait = %d", d)
	}
	// Admitted while waiting: nil, even with a context that ends later.
	w = mustEnter(t, g, Normal, c.try)
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- w.Wait(ctx) }()
	c.release(1)
	g.Kick()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Wait = %v after admission", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait not woken by admission")
	}
	// Already admitted and already cancelled: admission wins.
	c.release(1)
	w = mustEnter(t, g, Normal, c.try)
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := w.Wait(ctx); err != nil {
		t.Errorf("Wait on admitted waiter with cancelled ctx = %v", err)
	}
}

// admitAll releases one unit at a time and kicks, returning the admission
// order of the given waiters by name.
func admitAll(t *testing.T, g *Gate, c *capacity, names map[*Waiter]string) []string {
	t.Helper()
	var order []string
	for range names {
		c.release(1)
		if n := g.kick(); n != 1 {
			t.Fatalf("Kick admitted %d, want 1", n)
		}
		for w, name := range names {
			if isReady(w) && !slices.Contains(order, name) {
				order = append(order, name)
			}
		}
	}
	return order
}

func TestStrictPriority(t *testing.T) {
	g, clk := newTestGate(Config{Aging: -1})
	c := &capacity{}
	names := map[*Waiter]string{}
	arrivals := []struct {
		b    Band
		name string
	}{
		{Low, "L1"}, {Normal, "N1"}, {High, "H1"}, {Low, "L2"}, {High, "H2"},
		{Normal, "N2"}, {Low, "L3"}, {High, "H3"}, {Normal, "N3"},
	}
	for _, a := range arrivals {
		names[mustEnter(t, g, a.b, c.try)] = a.name
		clk.Advance(time.Hour) // aging is off: time must not matter
	}
	want := []string{"H1", "H2", "H3", "N1", "N2", "N3", "L1", "L2", "L3"}
	for w, name := range names {
		if p := w.Position(); want[p-1] != name {
			t.Errorf("%s.Position() = %d, want %d", name, p, slices.Index(want, name)+1)
		}
	}
	if got := admitAll(t, g, c, names); !slices.Equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
}

func TestNewcomerDoesNotOvertake(t *testing.T) {
	g, _ := newTestGate(Config{})
	c := &capacity{}
	mustEnter(t, g, Normal, c.try) // parked: no capacity
	c.release(1)
	calls := 0
	try := func() bool { calls++; return c.try() }
	// Equal or lower band behind a parked Normal: must park without trying.
	for _, b := range []Band{Normal, Low} {
		if w := mustEnter(t, g, b, try); isReady(w) {
			t.Errorf("%v newcomer overtook a parked Normal waiter", b)
		}
	}
	if calls != 0 {
		t.Errorf("newcomer try() called %d times while it had waiters ahead", calls)
	}
	// A High newcomer outranks the parked Normal one and takes the slot.
	if w := mustEnter(t, g, High, try); !isReady(w) {
		t.Error("High newcomer not admitted past parked Normal/Low waiters")
	}
}

func TestAging(t *testing.T) {
	g, clk := newTestGate(Config{Aging: 10 * time.Second})
	c := &capacity{}
	names := map[*Waiter]string{}
	enter := func(b Band, name string) *Waiter {
		w := mustEnter(t, g, b, c.try)
		names[w] = name
		return w
	}
	l1 := enter(Low, "L1") // t=0
	clk.Advance(2 * time.Second)
	n1 := enter(Normal, "N1") // t=2
	clk.Advance(3 * time.Second)
	h1 := enter(High, "H1") // t=5
	if p := l1.Position(); p != 3 {
		t.Errorf("before aging L1 position %d, want 3", p)
	}
	clk.Advance(6 * time.Second) // t=11: L1 aged (11s), N1 not (9s)
	h2 := enter(High, "H2")
	n2 := enter(Normal, "N2")
	wantPos := map[*Waiter]int{l1: 1, h1: 2, h2: 3, n1: 4, n2: 5}
	for w, p := range wantPos {
		if got := w.Position(); got != p {
			t.Errorf("t=11 %s position %d, want %d", names[w], got, p)
		}
	}
	if a := g.Ahead(Low); a != 5 {
		t.Errorf("Ahead(Low) = %d, want 5", a)
	}
	if a := g.Ahead(High); a != 3 {
		t.Errorf("Ahead(High) = %d, want 3 (L1 aged, H1, H2)", a)
	}
	clk.Advance(time.Second) // t=12: N1 aged too (10s), ahead of H1 (t=5)? No: N1 arrived at 2 < 5.
	wantPos = map[*Waiter]int{l1: 1, n1: 2, h1: 3, h2: 4, n2: 5}
	for w, p := range wantPos {
		if got := w.Position(); got != p {
			t.Errorf("t=12 %s position %d, want %d", names[w], got, p)
		}
	}
	got := admitAll(t, g, c, names)
	if want := []string{"L1", "N1", "H1", "H2", "N2"}; !slices.Equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
	if s := g.Stats(); s.Aged[Low] != 1 || s.Aged[Normal] != 1 || s.Aged[High] != 0 {
		t.Errorf("Aged = %v", s.Aged)
	}
}

func TestAgedLowBeforeFreshNormal(t *testing.T) {
	g, clk := newTestGate(Config{Aging: time.Second})
	c := &capacity{}
	names := map[*Waiter]string{}
	names[mustEnter(t, g, Low, c.try)] = "L1"
	clk.Advance(2 * time.Second)
	names[mustEnter(t, g, Normal, c.try)] = "N1"
	names[mustEnter(t, g, Low, c.try)] = "L2"
	// A fresh Normal newcomer has an aged Low ahead of it.
	if a := g.Ahead(Normal); a != 2 {
		t.Errorf("Ahead(Normal) = %d, want 2 (aged L1, N1)", a)
	}
	got := admitAll(t, g, c, names)
	if want := []string{"L1", "N1", "L2"}; !slices.Equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
}

func TestQueueFull(t *testing.T) {
	g, _ := newTestGate(Config{QueueSize: 2})
	c := &capacity{}
	for range 2 {
		mustEnter(t, g, Normal, c.try)
	}
	if _, err := g.Enter(Normal, c.try); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third Normal: err = %v, want ErrQueueFull", err)
	}
	// Other bands have their own limit.
	mustEnter(t, g, Low, c.try)
	// A full band still admits at once when it is allowed to and try works.
	g2, _ := newTestGate(Config{QueueSize: 1})
	c2 := &capacity{}
	mustEnter(t, g2, Low, c2.try)
	c2.release(1)
	if w := mustEnter(t, g2, High, c2.try); !isReady(w) {
		t.Error("High with capacity not admitted")
	}
	s := g.Stats()
	if s.Rejected[Normal] != 1 || s.Depth[Normal] != 2 || s.Depth[Low] != 1 {
		t.Errorf("stats = %+v", s)
	}
	// Growing the queue on reload takes effect for the next request.
	g.SetConfig(Config{QueueSize: 3})
	mustEnter(t, g, Normal, c.try)
	// Shrinking keeps the parked ones but refuses new ones.
	g.SetConfig(Config{QueueSize: 1})
	if _, err := g.Enter(Normal, c.try); !errors.Is(err, ErrQueueFull) {
		t.Errorf("after shrink: err = %v", err)
	}
	if d := g.Stats().Depth[Normal]; d != 3 {
		t.Errorf("depth after shrink = %d, want 3", d)
	}
}

func TestNoParking(t *testing.T) {
	g, _ := newTestGate(Config{QueueSize: -1})
	c := &capacity{free: 1}
	if w := mustEnter(t, g, Normal, c.try); !isReady(w) {
		t.Error("not admitted with capacity")
	}
	if _, err := g.Enter(High, c.try); !errors.Is(err, ErrQueueFull) {
		t.Errorf("err = %v, want ErrQueueFull", err)
	}
}

func TestLeave(t *testing.T) {
	g, clk := newTestGate(Config{})
	c := &capacity{}
	a := mustEnter(t, g, Normal, c.try)
	b := mustEnter(t, g, Normal, c.try)
	d := mustEnter(t, g, Normal, c.try)
	clk.Advance(time.Second)
	if b.Leave() {
		t.Fatal("Leave of a parked waiter reported admitted")
	}
	if s := g.Stats(); s.Depth[Normal] != 2 || s.Abandoned[Normal] != 1 {
		t.Errorf("after Leave: stats = %+v", s)
	}
	if b.Position() != 2 || d.Position() != 2 || a.Position() != 1 {
		t.Errorf("positions a=%d b=%d d=%d, want 1 2 (when it left) 2", a.Position(), b.Position(), d.Position())
	}
	if b.Waited() != time.Second {
		t.Errorf("Waited = %v", b.Waited())
	}
	if b.Leave() {
		t.Error("second Leave reported admitted")
	}
	c.release(3)
	if n := g.kick(); n != 2 {
		t.Errorf("Kick admitted %d, want 2", n)
	}
	if isReady(b) {
		t.Error("a waiter that left became ready")
	}
	if c.free != 1 {
		t.Errorf("free = %d, want 1 (the leaver took nothing)", c.free)
	}
}

func TestKickStopsAtFirstFailure(t *testing.T) {
	g, _ := newTestGate(Config{})
	blocked, bCalls := false, 0
	headTry := func() bool { bCalls++; return blocked }
	c := &capacity{}
	head := mustEnter(t, g, Normal, headTry)
	second := mustEnter(t, g, Normal, c.try)
	c.release(1)
	if n := g.kick(); n != 0 {
		t.Fatalf("Kick admitted %d past a failing head", n)
	}
	if c.calls != 0 {
		t.Errorf("try of the second waiter called %d times", c.calls)
	}
	if bCalls != 2 || isReady(second) { // once in Enter, once in Kick
		t.Errorf("head tried %d times, second ready=%v", bCalls, isReady(second))
	}
	// The blocking head leaving gives the next one its chance at once.
	head.Leave()
	if !isReady(second) {
		t.Error("Leave of the blocking head did not admit the next waiter")
	}
}

func TestStats(t *testing.T) {
	g, clk := newTestGate(Config{})
	c := &capacity{}
	mustEnter(t, g, High, c.try)
	clk.Advance(2 * time.Second)
	mustEnter(t, g, Low, c.try)
	mustEnter(t, g, Low, c.try)
	clk.Advance(time.Second)
	s := g.Stats()
	if s.Depth != [NumBands]int{1, 0, 2} {
		t.Errorf("Depth = %v", s.Depth)
	}
	if s.OldestWait != [NumBands]time.Duration{3 * time.Second, 0, time.Second} {
		t.Errorf("OldestWait = %v", s.OldestWait)
	}
	if s.Parked != [NumBands]uint64{1, 0, 2} {
		t.Errorf("Parked = %v", s.Parked)
	}
}

func TestDrainRate(t *testing.T) {
	g, clk := newTestGate(Config{})
	if r := g.DrainRate(); r != 0 {
		t.Errorf("initial rate %v", r)
	}
	c := &capacity{}
	// 20 admissions per second for 30 s.
	for range 600 {
		clk.Advance(50 * time.Millisecond)
		c.release(1)
		mustEnter(t, g, Normal, c.try)
	}
	if r := g.DrainRate(); r < 18 || r > 22 {
		t.Errorf("rate after steady 20/s = %v", r)
	}
	// A young gate is not underestimated: 2 s at 50/s.
	g2, clk2 := newTestGate(Config{})
	for range 100 {
		clk2.Advance(20 * time.Millisecond)
		c.release(1)
		mustEnter(t, g2, Normal, c.try)
	}
	if r := g2.DrainRate(); r < 45 || r > 55 {
		t.Errorf("young gate rate = %v, want ~50", r)
	}
	// A stalled fleet: the rate decays.
	clk.Advance(30 * time.Second)
	if r := g.Stats().DrainRate; r > 2 {
		t.Errorf("rate 30 s after the last admission = %v", r)
	}
}

// TestLeaveRacesAdmission hammers Leave against Kick from many goroutines:
// every reservation made inside try() must end up with exactly one owner,
// so the capacity is whole again at the end.
func TestLeaveRacesAdmission(t *testing.T) {
	const (
		slots   = 4
		clients = 64
		rounds  = 50
	)
	g := NewGate(Config{QueueSize: 100000, Aging: time.Millisecond})
	var free, reserved atomic.Int64
	free.Store(slots)
	try := func() bool {
		if free.Add(-1) >= 0 {
			reserved.Add(1)
			return true
		}
		free.Add(1)
		return false
	}
	release := func() {
		reserved.Add(-1)
		free.Add(1)
		g.Kick()
	}
	var admittedN, leftN atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range rounds {
				w, err := g.Enter(Band(r.IntN(NumBands)), try)
				if err != nil {
					t.Error(err)
					return
				}
				switch r.IntN(3) {
				case 0: // wait for admission
					<-w.Ready()
					admittedN.Add(1)
					release()
				case 1: // give up at once
					if w.Leave() {
						admittedN.Add(1)
						release()
					} else {
						leftN.Add(1)
					}
				default: // give up after a short wait
					select {
					case <-w.Ready():
						if !w.Leave() {
							t.Error("Leave after Ready returned false")
						}
						admittedN.Add(1)
						release()
					case <-time.After(time.Duration(r.IntN(200)) * time.Microsecond):
						if w.Leave() {
							<-w.Ready() // admitted: Ready must be closed
							admittedN.Add(1)
							release()
						} else {
							leftN.Add(1)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if f, r := free.Load(), reserved.Load(); f != slots || r != 0 {
		t.Errorf("capacity leaked: free=%d reserved=%d", f, r)
	}
	s := g.Stats()
	var adm, ab, depth uint64
	for b := range NumBands {
		adm += s.Admitted[b]
		ab += s.Abandoned[b]
		depth += uint64(s.Depth[b])
	}
	if depth != 0 || adm != uint64(admittedN.Load()) || ab != uint64(leftN.Load()) {
		t.Errorf("stats admitted=%d abandoned=%d depth=%d; clients saw admitted=%d left=%d",
			adm, ab, depth, admittedN.Load(), leftN.Load())
	}
	if adm+ab != clients*rounds {
		t.Errorf("admitted+abandoned = %d, want %d", adm+ab, clients*rounds)
	}
	if g.waiting.Load() != 0 {
		t.Errorf("waiting counter = %d", g.waiting.Load())
	}
}

// modelWaiter mirrors a parked waiter in the reference model.
type modelWaiter struct {
	w    *Waiter
	band Band
	t    int64
	seq  int
}

// modelOrder returns the parked waiters in effective admission order,
// computed the obvious way: sort by (effective band, arrival).
func modelOrder(ws []modelWaiter, now, aging int64) []modelWaiter {
	eff := func(m modelWaiter) int {
		if aging > 0 && now-m.t >= aging {
			return int(High)
		}
		return int(m.band)
	}
	out := slices.Clone(ws)
	slices.SortStableFunc(out, func(a, b modelWaiter) int {
		if d := eff(a) - eff(b); d != 0 {
			return d
		}
		return a.seq - b.seq
	})
	return out
}

// TestGateAgainstModel drives the gate with random operations and compares
// positions, depths and admissions with a brute-force model. It also
// exercises tombstone compaction (many out-of-order leaves).
func TestGateAgainstModel(t *testing.T) {
	for _, aging := range []time.Duration{-1, 50 * time.Millisecond} {
		t.Run(fmt.Sprint("aging=", aging), func(t *testing.T) {
			g, clk := newTestGate(Config{QueueSize: 400, Aging: aging})
			agingNs := int64(max(aging, 0))
			r := rand.New(rand.NewPCG(1, uint64(aging)))
			c := &capacity{}
			var model []modelWaiter
			seq := 0
			now := int64(0)
			for step := range 20000 {
				switch op := r.IntN(10); {
				case op < 5: // enter
					b := Band(r.IntN(NumBands))
					order := modelOrder(model, now, agingNs)
					ahead := 0
					for _, m := range order {
						e := int(m.band)
						if agingNs > 0 && now-m.t >= agingNs {
							e = int(High)
						}
						if e <= int(b) {
							ahead++
						}
					}
					if got := g.Ahead(b); got != ahead {
						t.Fatalf("step %d: Ahead(%v) = %d, model %d", step, b, got, ahead)
					}
					if r.IntN(4) == 0 {
						c.release(1)
					}
					w, err := g.Enter(b, c.try)
					if err != nil {
						if !errors.Is(err, ErrQueueFull) {
							t.Fatal(err)
						}
						continue
					}
					if isReady(w) {
						if ahead != 0 {
							t.Fatalf("step %d: fast path with %d ahead", step, ahead)
						}
						w.Leave()
						c.release(1)
						continue
					}
					seq++
					model = append(model, modelWaiter{w: w, band: b, t: now, seq: seq})
				case op < 7 && len(model) > 0: // leave
					i := r.IntN(len(model))
					wantPos := slices.IndexFunc(modelOrder(model, now, agingNs), func(m modelWaiter) bool { return m.w == model[i].w }) + 1
					if model[i].w.Leave() {
						t.Fatalf("step %d: parked waiter reported admitted", step)
					}
					if p := model[i].w.Position(); p != wantPos {
						t.Fatalf("step %d: position after Leave %d, model %d", step, p, wantPos)
					}
					model = slices.Delete(model, i, i+1)
					// Leaving the head kicks; mirror that in the model below.
					fallthrough
				case op < 8: // kick
					if op >= 7 {
						c.release(r.IntN(3))
					}
					if op >= 7 {
						g.Kick()
					}
					order := modelOrder(model, now, agingNs)
					var remaining []modelWaiter
					for _, m := range order {
						if isReady(m.w) {
							if len(remaining) > 0 {
								t.Fatalf("step %d: admitted out of order", step)
							}
							continue
						}
						remaining = append(remaining, m)
					}
					model = remaining
				default: // time passes
					d := time.Duration(r.IntN(20)) * time.Millisecond
					clk.Advance(d)
					now += int64(d)
				}
				order := modelOrder(model, now, agingNs)
				for i, m := range order {
					if p := m.w.Position(); p != i+1 {
						t.Fatalf("step %d: position %d, model %d (band %v)", step, p, i+1, m.band)
					}
				}
				var depth [NumBands]int
				for _, m := range model {
					depth[m.band]++
				}
				if s := g.Stats(); s.Depth != depth {
					t.Fatalf("step %d: depth %v, model %v", step, s.Depth, depth)
				}
			}
		})
	}
}
