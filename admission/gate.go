package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Default configuration values.
const (
	DefaultQueueSize = 1024
	DefaultAging     = 10 * time.Second
)

// drainTau is the time constant of the admission-rate estimate behind
// Stats.DrainRate: long enough to smooth bursts, short enough that a stalled
// fleet shows a falling rate within seconds.
const drainTau = 10 * time.Second

// ErrQueueFull is returned by Gate.Enter when the request cannot be admitted
// at once and its band already holds Config.QueueSize parked requests.
var ErrQueueFull = errors.New("admission: queue full")

// Config tunes a Gate. The zero value selects the defaults.
type Config struct {
	// QueueSize is the maximum number of parked requests per band. 0 means
	// DefaultQueueSize; a negative value disables parking, so a request that
	// cannot be admitted at once gets ErrQueueFull. A full band answers
	// ErrQueueFull at once.
	QueueSize int
	// Aging is how long a waiter may be parked before it is served as High,
	// so a low band is never starved forever. 0 means DefaultAging; a
	// negative value disables aging (strict priority).
	Aging time.Duration
}

// normalized returns c with defaults applied: QueueSize >= 0, Aging > 0 or
// aging disabled (0 after normalization means disabled).
func (c Config) normalized() Config {
	switch {
	case c.QueueSize == 0:
		c.QueueSize = DefaultQueueSize
	case c.QueueSize < 0:
		c.QueueSize = 0
	}
	switch {
	case c.Aging == 0:
		c.Aging = DefaultAging
	case c.Aging < 0:
		c.Aging = 0
	}
	return c
}

// TryFunc attempts to reserve capacity for one request. The gate calls it
// with its lock held, in admission order, so it must be quick and must not
// call back into the Gate or block. It returns true only when capacity
// existed and has been reserved by the callee; the reservation then belongs
// to the request whose Waiter is admitted.
type TryFunc func() bool

// Pass says what a PlacedFunc may reserve.
type Pass uint8

const (
	// PassAny: any engine with room, the request's preferred one first.
	PassAny Pass = iota
	// PassPreferred: only the engine the request prefers (its prefix
	// holder); false when that one cannot take it now. The gate asks this
	// of waiters it would let overtake the head of their band.
	PassPreferred
)

// PlacedFunc is a TryFunc for a request that prefers an engine: the gate
// says which pass it runs. The same rules as for TryFunc apply.
type PlacedFunc func(Pass) bool

// scanLimit bounds the waiters one Kick asks for their preferred engine,
// so a Kick costs O(scanLimit) tries however many are parked.
const scanLimit = 128

// Gate parks requests that find no capacity and admits them in priority
// order when Kick is called.
//
// Order: waiters are served strictly by band (High, then Normal, then Low),
// FIFO inside a band. A waiter parked for Config.Aging or longer is served
// as High (in arrival order among High waiters), so Low makes progress under
// sustained High load. Admission is head-of-line: Kick stops at the first
// waiter whose try fails with PassAny, so a later waiter never takes
// capacity ahead of an earlier one of equal or higher effective priority,
// with one exception: before trying the head of a band, Kick asks the
// band's first scanLimit placed waiters (EnterPlaced) whether their
// preferred engine can take them (PassPreferred), and admits those that
// it can — a request whose prefix is cached on the engine that just freed
// goes ahead of one that would prefill cold there. Aged waiters are never
// overtaken: the scan stops at the first, and a band's scan runs only
// while no waiter of a higher effective band is parked.
//
// The gate starts no goroutines and never sleeps: a parked request waits on
// its Waiter's Ready channel, which Kick closes. All methods are safe for
// concurrent use.
type Gate struct {
	mu     sync.Mutex
	cfg    Config // normalized
	q      [NumBands]bandQueue
	seq    uint64
	epoch  time.Time
	now    func() time.Time // time.Now, replaced in tests
	closed chan struct{}    // already closed: Ready of fast-path waiters

	// waiting counts parked waiters plus an Enter in its try(). Kick reads
	// it without the lock to return at once on an empty queue. Enter raises
	// it before calling try(), so a Kick that sees zero is ordered before
	// that try() and the capacity it was signalling is visible to it: no
	// wakeup is lost.
	waiting atomic.Int64

	admitted, parked, rejected, abandoned, aged, preferred [NumBands]uint64
	rateCount                                              float64 // decayed admission count
	rateAt                                                 int64   // when rateCount was last decayed
}

// NewGate returns a gate with the given configuration.
func NewGate(cfg Config) *Gate { return NewGateClock(cfg, time.Now) }

// NewGateClock returns a gate that reads the time from now: waits, aging
// and the drain rate in the caller's time (a simulation's clock). now must
// be monotonic.
func NewGateClock(cfg Config, now func() time.Time) *Gate {
	g := &Gate{cfg: cfg.normalized(), now: now, closed: make(chan struct{})}
	close(g.closed)
	g.epoch = g.now()
	return g
}

// SetConfig replaces the configuration, e.g. on a config reload. Parked
// waiters stay parked even if their band is now over QueueSize; only new
// requests are refused. A new Aging applies to the next admission decision.
func (g *Gate) SetConfig(cfg Config) {
	g.mu.Lock()
	g.cfg = cfg.normalized()
	g.mu.Unlock()
}

// Config returns the configuration in force with defaults filled in;
// disabled parking or aging show as -1, so the result can be passed back to
// SetConfig unchanged.
func (g *Gate) Config() Config {
	g.mu.Lock()
	c := g.cfg
	g.mu.Unlock()
	if c.QueueSize == 0 {
		c.QueueSize = -1
	}
	if c.Aging == 0 {
		c.Aging = -1
	}
	return c
}

// nowNanos returns the current time as nanoseconds since the gate's epoch.
// Monotonic, because time.Now carries a monotonic reading.
func (g *Gate) nowNanos() int64 { return int64(g.now().Sub(g.epoch)) }

// agedCutoff returns the arrival time at or before which a waiter counts as
// aged, or math.MinInt64 when aging is disabled.
func (g *Gate) agedCutoff(now int64) int64 {
	if g.cfg.Aging <= 0 {
		return math.MinInt64
	}
	return now - int64(g.cfg.Aging)
}

// Enter asks for admission in band. If no waiter of equal or higher
// effective priority is parked and try() reserves capacity, the request is
// admitted at once: the returned Waiter's Ready channel is already closed.
// Otherwise the request is parked and the caller waits on Ready (and on its
// own deadline and context, calling Leave when it gives up), or, when the
// band is full, Enter returns ErrQueueFull without parking.
//
// An invalid band or a nil try is a programming error and yields an error.
func (g *Gate) Enter(band Band, try TryFunc) (*Waiter, error) {
	if try == nil {
		return nil, errors.New("admission: enter: nil TryFunc")
	}
	// A plain request prefers no engine: it never passes PassPreferred.
	return g.enter(band, func(p Pass) bool { return p == PassAny && try() }, false)
}

// EnterPlaced is Enter for a request that prefers an engine. Besides
// Enter's rule, it is admitted at once when waiters of its own effective
// band (none aged) are parked but its preferred engine can take it, and a
// Kick may admit it ahead of its turn for the same reason (see Gate).
func (g *Gate) EnterPlaced(band Band, try PlacedFunc) (*Waiter, error) {
	if try == nil {
		return nil, errors.New("admission: enter: nil PlacedFunc")
	}
	return g.enter(band, try, true)
}

func (g *Gate) enter(band Band, try PlacedFunc, placed bool) (*Waiter, error) {
	if !band.valid() {
		return nil, fmt.Errorf("admission: enter: invalid band %d", int(band))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.nowNanos()
	pass, attempt := PassAny, g.aheadOfNewcomer(band, now) == 0
	if !attempt && placed && g.mayOvertake(band, now) {
		pass, attempt = PassPreferred, true
	}
	if attempt && g.tryNewcomer(try, pass) {
		g.countAdmission(band, now, false)
		if pass == PassPreferred {
			g.preferred[band]++
		}
		return &Waiter{g: g, ready: g.closed, band: band, state: stateAdmitted, t: now, done: now, order: OrderImmediate}, nil
	}
	q := &g.q[band]
	if q.live >= g.cfg.QueueSize {
		g.rejected[band]++
		return nil, ErrQueueFull
	}
	g.seq++
	w := &Waiter{g: g, ready: make(chan struct{}), try: try, placed: placed, band: band, state: stateParked, t: now, seq: g.seq}
	q.push(w)
	g.waiting.Add(1)
	g.parked[band]++
	return w, nil
}

// tryNewcomer runs a newcomer's try, counted in waiting meanwhile.
func (g *Gate) tryNewcomer(try PlacedFunc, pass Pass) (ok bool) {
	g.waiting.Add(1)
	// Undo the tentative count even if try panics, so a buggy try cannot
	// leave Kick's fast path disabled.
	defer g.waiting.Add(-1)
	return try(pass)
}

// mayOvertake reports whether a placed newcomer in band may ask for its
// preferred engine although waiters are parked: only those of its own
// effective band are, and none of them is aged.
func (g *Gate) mayOvertake(band Band, now int64) bool {
	cutoff := g.agedCutoff(now)
	agedNormal, agedLow := g.q[Normal].countArrivedBy(cutoff), g.q[Low].countArrivedBy(cutoff)
	switch band {
	case High:
		return agedNormal+agedLow == 0
	case Normal:
		return g.q[High].live+agedNormal+agedLow == 0
	}
	return g.q[High].live+g.q[Normal].live+agedLow == 0
}

// Kick tells the gate that capacity may have become available (a gauge poll,
// a completed request). It admits parked waiters in order while their
// try succeeds and stops at the first failure, after letting placed waiters
// whose preferred engine has room go first (see Gate). It returns at once when
// nothing is parked and never blocks on waiters; admitted waiters are woken
// by closing their Ready channel.
func (g *Gate) Kick() { g.kick() }

// kick is Kick returning the number admitted.
func (g *Gate) kick() int {
	if g.waiting.Load() == 0 {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kickLocked(g.nowNanos())
}

func (g *Gate) kickLocked(now int64) int {
	cutoff := g.agedCutoff(now)
	n := 0
	var scanned [NumBands]bool
	for {
		w, aged := g.next(cutoff)
		if w == nil {
			return n
		}
		if !aged && !scanned[w.band] {
			// Once per band and Kick: what the head does not take is still
			// free for a later waiter's preferred engine only while the
			// head has not taken it with PassAny.
			scanned[w.band] = true
			n += g.preferredPass(w.band, cutoff, now)
			continue // the head may have been admitted
		}
		// A panicking try leaves w parked; the deferred Unlock of the
		// caller (Kick or Leave) releases the lock as the panic unwinds.
		if !w.try(PassAny) {
			return n
		}
		g.admitLocked(w, now, aged, false)
		n++
	}
}

// preferredPass asks the first scanLimit placed waiters of band, in order
// and up to the first aged waiter, whether their preferred engine can take
// them, and admits those it can. The head of the band is not aged (the
// caller checks), so in Normal and Low none is; in High the scan stops
// where the aged waiters of the lower bands join.
func (g *Gate) preferredPass(band Band, cutoff, now int64) int {
	stop := uint64(math.MaxUint64)
	if band == High {
		for b := Normal; b < NumBands; b++ {
			if w := g.q[b].first(); w != nil && w.t <= cutoff {
				stop = min(stop, w.seq)
			}
		}
	}
	// Collected first: admitting removes slots, which may compact the queue.
	var buf [scanLimit]*Waiter
	cands := buf[:0]
	q := &g.q[band]
	for i, seen := q.head, 0; i < len(q.slots) && seen < scanLimit; i++ {
		w := q.slots[i].w
		if w == nil {
			continue
		}
		if w.seq >= stop {
			break
		}
		seen++
		if w.placed {
			cands = append(cands, w)
		}
	}
	n := 0
	for _, w := range cands {
		if w.try(PassPreferred) {
			g.admitLocked(w, now, false, true)
			n++
		}
	}
	return n
}

// admitLocked takes a parked waiter out of its queue and wakes it.
func (g *Gate) admitLocked(w *Waiter, now int64, aged, preferred bool) {
	g.q[w.band].remove(w.idx)
	g.waiting.Add(-1)
	w.state = stateAdmitted
	w.done = now
	w.order = OrderFIFO
	switch {
	case aged:
		w.order = OrderAged
	case preferred:
		w.order = OrderPreferred
	}
	w.try = nil // drop the caller's closure early
	close(w.ready)
	g.countAdmission(w.band, now, aged)
	if preferred {
		g.preferred[w.band]++
	}
}

// next returns the waiter to admit next and whether it is served through
// aging rather than its own band, or nil when nothing is parked. Aged
// waiters join High in arrival order.
func (g *Gate) next(cutoff int64) (*Waiter, bool) {
	var best *Waiter
	bestAged := false
	for b := High; b < NumBands; b++ {
		w := g.q[b].first()
		if w == nil {
			continue
		}
		if b == High || w.t <= cutoff {
			if best == nil || w.seq < best.seq {
				best, bestAged = w, b != High
			}
		}
	}
	if best != nil {
		return best, bestAged
	}
	for b := Normal; b < NumBands; b++ {
		if w := g.q[b].first(); w != nil {
			return w, false
		}
	}
	return nil, false
}

// aheadOfNewcomer returns how many parked waiters a request entering band
// now would queue behind.
func (g *Gate) aheadOfNewcomer(band Band, now int64) int {
	if g.waiting.Load() == 0 {
		return 0
	}
	cutoff := g.agedCutoff(now)
	n := g.q[High].live
	switch band {
	case High:
		n += g.q[Normal].countArrivedBy(cutoff) + g.q[Low].countArrivedBy(cutoff)
	case Normal:
		n += g.q[Normal].live + g.q[Low].countArrivedBy(cutoff)
	case Low:
		n += g.q[Normal].live + g.q[Low].live
	}
	return n
}

// Ahead returns how many parked requests a new request in band would wait
// behind right now; with a drain rate it gives a Retry-After for a request
// refused with ErrQueueFull. An invalid band returns the total parked.
func (g *Gate) Ahead(band Band) int {
	if !band.valid() {
		band = Low
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aheadOfNewcomer(band, g.nowNanos())
}

// position returns w's 1-based place in effective admission order.
func (g *Gate) position(w *Waiter, now int64) int {
	cutoff := g.agedCutoff(now)
	hi, no, lo := &g.q[High], &g.q[Normal], &g.q[Low]
	if w.band == High || w.t <= cutoff {
		// Among effective-High waiters, in arrival order. Within a band the
		// aged waiters and those that arrived before w are both prefixes,
		// so the overlap is the shorter one.
		n := hi.countBefore(w.seq)
		n += min(no.countArrivedBy(cutoff), no.countBefore(w.seq))
		n += min(lo.countArrivedBy(cutoff), lo.countBefore(w.seq))
		return n + 1
	}
	if w.band == Normal {
		return hi.live + lo.countArrivedBy(cutoff) + no.rank(w.idx) + 1
	}
	return hi.live + no.live + lo.rank(w.idx) + 1
}

// countAdmission updates counters and the decayed admission-rate estimate.
func (g *Gate) countAdmission(band Band, now int64, aged bool) {
	g.admitted[band]++
	if aged {
		g.aged[band]++
	}
	g.rateCount = g.decayedCount(now) + 1
	g.rateAt = now
}

func (g *Gate) decayedCount(now int64) float64 {
	dt := now - g.rateAt
	if dt <= 0 {
		return g.rateCount
	}
	return g.rateCount * math.Exp(-float64(dt)/float64(drainTau))
}

// drainRate returns admissions per second, exponentially weighted with time
// constant drainTau and corrected for the gate being younger than that.
func (g *Gate) drainRate(now int64) float64 {
	age := float64(now) / float64(drainTau)
	if age <= 0 {
		return 0
	}
	return g.decayedCount(now) / (drainTau.Seconds() * -math.Expm1(-age))
}

// DrainRate returns the recent admission rate in requests per second (an
// exponentially weighted average over roughly the last 10 s). While requests
// are parked, every admission comes off the queue, so this is the rate at
// which the queue drains: the divisor for RetryAfter.
func (g *Gate) DrainRate() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.drainRate(g.nowNanos())
}

// Stats is a snapshot of a gate's queues and counters, indexed by Band.
type Stats struct {
	Depth      [NumBands]int           // parked now
	OldestWait [NumBands]time.Duration // wait of the oldest parked waiter, 0 if none
	Admitted   [NumBands]uint64        // admitted since creation, at once or after parking
	Parked     [NumBands]uint64        // ever parked
	Rejected   [NumBands]uint64        // refused with ErrQueueFull
	Abandoned  [NumBands]uint64        // left while parked (client gone, timed out)
	Aged       [NumBands]uint64        // admitted through aging, ahead of their own band
	Preferred  [NumBands]uint64        // admitted ahead of their turn: their preferred engine had room
	DrainRate  float64                 // see Gate.DrainRate
}

// Stats returns a snapshot of the gate.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.nowNanos()
	s := Stats{
		Admitted:  g.admitted,
		Parked:    g.parked,
		Rejected:  g.rejected,
		Abandoned: g.abandoned,
		Aged:      g.aged,
		Preferred: g.preferred,
		DrainRate: g.drainRate(now),
	}
	for b := range NumBands {
		q := &g.q[b]
		s.Depth[b] = q.live
		if w := q.first(); w != nil {
			s.OldestWait[b] = time.Duration(now - w.t)
		}
	}
	return s
}

type waiterState uint8

const (
	stateParked waiterState = iota
	stateAdmitted
	stateLeft
)

// Waiter is one request's place at the gate, returned by Gate.Enter.
type Waiter struct {
	g       *Gate
	ready   chan struct{}
	try     PlacedFunc
	placed  bool   // entered with EnterPlaced: asked for PassPreferred
	t       int64  // arrival, ns since the gate's epoch
	done    int64  // admission or departure time
	seq     uint64 // arrival order
	idx     int    // slot in g.q[band] while parked
	leftPos int    // position when it left
	band    Band
	state   waiterState // guarded by g.mu
	order   Order       // how it was admitted; guarded by g.mu
}

// Order is how a request was admitted, for metrics: at once, or after
// parking in its band's order (FIFO), ahead of it because its preferred
// engine could take it (Preferred), or through aging (Aged).
type Order uint8

// Orders of admission.
const (
	OrderNone      Order = iota // not admitted (yet)
	OrderImmediate              // admitted on arrival, never parked
	OrderFIFO                   // parked, admitted in its band's turn
	OrderPreferred              // parked, overtook its band: its preferred engine had room
	OrderAged                   // parked longer than Aging, served ahead of its band
)

// String is the order's metric label.
func (o Order) String() string {
	switch o {
	case OrderImmediate:
		return "immediate"
	case OrderFIFO:
		return "fifo"
	case OrderPreferred:
		return "preferred"
	case OrderAged:
		return "aged"
	}
	return "none"
}

// Ready returns a channel that is closed when the request is admitted. It
// is never closed for a waiter that left.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// Leave takes the request out of the queue at once (client gone, deadline
// passed). It returns true if the request was admitted, possibly in a race
// with the caller giving up: the capacity reserved by its TryFunc then
// belongs to the caller, who must use or release it. Leave is idempotent and
// may be called after admission (it then just returns true).
// After Leave, Position reports the place the waiter had when it left, for
// the Retry-After of the refusal.
func (w *Waiter) Leave() (admitted bool) {
	g := w.g
	g.mu.Lock()
	defer g.mu.Unlock()
	switch w.state {
	case stateAdmitted:
		return true
	case stateLeft:
		return false
	}
	now := g.nowNanos()
	first, _ := g.next(g.agedCutoff(now))
	w.leftPos = g.position(w, now)
	g.q[w.band].remove(w.idx)
	g.waiting.Add(-1)
	w.state = stateLeft
	w.done = now
	w.try = nil
	g.abandoned[w.band]++
	if first == w {
		// The head may have been what blocked the others (head-of-line
		// admission): give the new head its chance now rather than at the
		// next Kick.
		g.kickLocked(now)
	}
	return false
}

// Wait blocks until the request is admitted or ctx is done, whichever comes
// first. It returns nil when admitted (the caller then owns the reservation),
// or ctx's error after leaving the queue. Handlers that must do something
// while parked (SSE keep-alives) select on Ready themselves instead.
func (w *Waiter) Wait(ctx context.Context) error {
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		if w.Leave() {
			return nil // admitted in a race with the deadline
		}
		return ctx.Err()
	}
}

// Position returns the waiter's current 1-based place in effective
// admission order: 1 means it is next. It changes as others are admitted,
// leave, arrive in higher bands, or age. It is 0 once the waiter was
// admitted; after Leave it is the place the waiter had when it left.
func (w *Waiter) Position() int {
	g := w.g
	g.mu.Lock()
	defer g.mu.Unlock()
	switch w.state {
	case stateAdmitted:
		return 0
	case stateLeft:
		return w.leftPos
	}
	return g.position(w, g.nowNanos())
}

// Order returns how the request was admitted (OrderNone while parked or
// after it left).
func (w *Waiter) Order() Order {
	g := w.g
	g.mu.Lock()
	defer g.mu.Unlock()
	return w.order
}

// Band returns the band the request entered.
func (w *Waiter) Band() Band { return w.band }

// Waited returns how long the request has been (or was, once admitted or
// gone) parked; 0 for a request admitted at once.
func (w *Waiter) Waited() time.Duration {
	g := w.g
	g.mu.Lock()
	defer g.mu.Unlock()
	end := w.done
	if w.state == stateParked {
		end = g.nowNanos()
	}
	return time.Duration(end - w.t)
}
