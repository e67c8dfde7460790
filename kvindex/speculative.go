package kvindex

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// predictions are the index's speculative entries (see Index.Predict).
//
// They live beside the mirrors, not in them: a mirror is the engine's own
// account of its cache, reference-counted event by event, and a guess has
// no place in it. predictions has its own lock, taken after the index's
// (ix.mu, then p.mu, never the other way), so the mirrors' event paths can
// confirm and drop entries under the index's write lock, and Match and
// Predict can consult them under its read lock. Match pays one atomic load
// when there are none, and walks only the engines that have some with
// them.
type predictions struct {
	n    atomic.Int64 // live entries, for the lock-free fast path
	next atomic.Int64 // when the oldest entry expires (see clockLocked); MaxInt64 when none
	// size holds, by slot, the block size predictions were made at, for
	// engines whose mirror has not learnt its own yet; 0 when the slot has
	// none.
	size []atomic.Int32

	// addMu serializes Predicts, whose steps (addStep) take mu one at a
	// time: see addStep.
	addMu sync.Mutex
	// betweenSteps, when set (by tests), runs between a Predict's steps
	// and between an expire's, with no lock held.
	betweenSteps func()

	mu        sync.RWMutex
	ttl       time.Duration
	clock     *clock
	stamp     int64 // the latest entry time given (see stampLocked)
	perEngine int
	total     int
	slots     []predSlot
	banks     []*keyTable // by bank: key → slots predicting it
	has       []uint64    // by bank: slots with entries
	st        PredictionStats
}

// predSlot is one engine's predictions.
type predSlot struct {
	// at maps the keys predicted on the engine to when each was first
	// predicted (see stampLocked), plus one, as a keyTable's 0 means
	// absent (stamps are never negative); nil before the first. Keys
	// are hashes already, which a keyTable indexes by directly: it took
	// a third of the cost of a Go map here (BenchmarkPredictNew128k).
	at *keyTable
	// fifoK and fifoAt hold (key, time) in prediction order, for expiry
	// and oldest-first eviction, one item per entry; items whose entry
	// is gone (or was ended and predicted anew) are stale and skipped.
	fifoK  []uint64
	fifoAt []int64
	head   int
}

// PredictionStats counts speculative entries, one per engine and block.
// Every inserted entry ends exactly once, so Inserted = Confirmed +
// Expired + Dropped + Live.
type PredictionStats struct {
	Live int
	// Inserted counts new entries (predicting a live entry again changes
	// nothing); Confirmed, entries the engine's BlockStored
	// turned real; Expired, entries whose TTL ended; Dropped, entries
	// removed early: BlockRemoved or eviction of the block, a reset or
	// removal of the engine, DropPredictions, the bounds, predictions
	// turned off.
	Inserted, Confirmed, Expired, Dropped uint64
}

// Outcomes returns the ended and inserted counts by outcome label, for
// metrics: inserted, confirmed, expired, dropped.
func (s PredictionStats) Outcomes() map[string]uint64 {
	return map[string]uint64{"inserted": s.Inserted, "confirmed": s.Confirmed, "expired": s.Expired, "dropped": s.Dropped}
}

type outcome int

const (
	outConfirmed outcome = iota
	outExpired
	outDropped
)

const (
	defaultMaxPredicted          = 1 << 17
	defaultMaxPredictedPerEngine = 1 << 15
)

func newPredictions(cfg IndexConfig, banks int) *predictions {
	p := &predictions{
		size:      make([]atomic.Int32, cfg.MaxEngines),
		clock:     newClock(cfg.Now),
		perEngine: cfg.MaxPredictedPerEngine,
		total:     cfg.MaxPredicted,
		slots:     make([]predSlot, cfg.MaxEngines),
		banks:     make([]*keyTable, banks),
		has:       make([]uint64, banks),
	}
	p.stamp = math.MinInt64
	if p.perEngine <= 0 {
		p.perEngine = defaultMaxPredictedPerEngine
	}
	if p.total <= 0 {
		p.total = defaultMaxPredicted
	}
	// makeRoomLocked's scan for the oldest entry overall does not see a
	// slot that is getting its first entries; the per-engine bound, kept
	// within the total, is what holds the total then.
	p.perEngine = min(p.perEngine, p.total)
	for i := range p.banks {
		p.banks[i] = new(keyTable)
	}
	p.next.Store(math.MaxInt64)
	return p
}

// any reports whether any entry may be live.
func (p *predictions) any() bool { return p.n.Load() > 0 }

// read is the clock's reading, for a look without the lock.
func (p *predictions) read() int64 { return p.clock.read() }

// clockLocked returns the time now, never earlier than a time it returned
// before (see clock): a slot's fifo stays in time order. p.mu held for
// writing.
func (p *predictions) clockLocked() int64 { return p.clock.monotonic() }

// stampLocked is the time for new entries: clockLocked, made later than
// any stamp given before (by a nanosecond per Predict within one reading
// of the clock), so that a fifo item names one insertion even when the
// clock stands still. p.mu held for writing.
func (p *predictions) stampLocked() int64 {
	p.stamp = max(p.clockLocked(), p.stamp+1)
	return p.stamp
}

// lockStep is how many keys a writer of the predictions records or ends
// under one hold of their write lock (see expire and Index.Predict), and
// how many blocks of an event a mirror applies under one hold of the
// index's (see Mirror.pauseLocked). A new
// 128Ki-token prompt has 8192, whose insertion took ~4 ms under one hold,
// and every other request's Match waited for all of it
// (BenchmarkMatchBesidePredict: p50 2.9–3.2 ms, then 27–29 µs).
const lockStep = 64

// expire ends the entries whose TTL has passed, lockStep at a time. It
// takes the lock only when the oldest entry is due, or the clock went
// back. It needs no lock of the index: call it before taking one, so that
// the index's writers are not held up by a long sweep either.
func (p *predictions) expire() {
	for {
		if now := p.read(); now >= p.clock.latest() && now < p.next.Load() {
			return
		}
		p.mu.Lock()
		done := p.sweepLocked(p.clockLocked(), lockStep)
		p.mu.Unlock()
		if done {
			return
		}
		p.pause()
	}
}

// pause runs the tests' betweenSteps hook, if any, between two steps of a
// writer, with no lock held.
func (p *predictions) pause() {
	if f := p.betweenSteps; f != nil {
		f()
	}
}

// sweepLocked ends entries older than the TTL at now, at most limit of
// them (no bound when limit <= 0), and sets next. It reports whether it
// ended them all; if not, next is left at or before now, so that the next
// expire or add goes on with the sweep.
func (p *predictions) sweepLocked(now int64, limit int) bool {
	ttl := int64(p.ttl)
	next := int64(math.MaxInt64)
	ended := 0
	for b, h := range p.has {
		for ; h != 0; h &= h - 1 {
			slot := b*64 + bits.TrailingZeros64(h)
			s := &p.slots[slot]
			for s.skipStale() && now-s.fifoAt[s.head] >= ttl {
				if limit > 0 && ended == limit {
					p.next.Store(min(next, s.fifoAt[s.head]+ttl))
					return false
				}
				p.endLocked(slot, s.fifoK[s.head], outExpired)
				ended++
			}
			if s.skipStale() {
				next = min(next, s.fifoAt[s.head]+ttl)
			}
		}
	}
	p.next.Store(next)
	return true
}

// skipStale advances the fifo head to the oldest live item and reports
// whether there is one.
func (s *predSlot) skipStale() bool {
	for s.head < len(s.fifoK) {
		if s.live(s.fifoK[s.head], s.fifoAt[s.head]) {
			return true
		}
		s.head++
	}
	return false
}

// live reports whether k is predicted on the engine since at: whether a
// fifo item (k, at) stands for a live entry.
func (s *predSlot) live(k uint64, at int64) bool {
	return s.at != nil && s.at.get(k) == uint64(at)+1
}

// predicted reports whether k is predicted on the engine.
func (s *predSlot) predicted(k uint64) bool { return s.at != nil && s.at.get(k) != 0 }

// maxKeptFifo is the capacity, in items, up to which an emptied slot keeps
// its fifos for the next predictions (16 KiB for the two).
const maxKeptFifo = 1024

// clear readies a slot with no entries for the next ones. Its key table
// stays: emptied, each of its subtables has shrunk to minSubSlots slots
// or none (74 KiB at most), and a slot empties whenever the engine's
// events confirm all of it — under steady traffic about one small request
// in five, and a new table each time was the largest allocation on a
// small request's path. Fifos grown past maxKeptFifo are let go.
func (s *predSlot) clear() {
	s.head = 0
	if cap(s.fifoK) > maxKeptFifo {
		s.fifoK, s.fifoAt = nil, nil
		return
	}
	s.fifoK, s.fifoAt = s.fifoK[:0], s.fifoAt[:0]
}

// entries is how many keys are predicted on the engine.
func (s *predSlot) entries() int {
	if s.at == nil {
		return 0
	}
	return s.at.len()
}

// compact drops consumed and stale fifo items; amortised O(1) per
// prediction, as the mirror's (see fifoLimit).
func (s *predSlot) compact() {
	j := 0
	for i := s.head; i < len(s.fifoK); i++ {
		k, at := s.fifoK[i], s.fifoAt[i]
		if s.live(k, at) {
			s.fifoK[j], s.fifoAt[j] = k, at
			j++
		}
	}
	s.fifoK, s.fifoAt, s.head = s.fifoK[:j], s.fifoAt[:j], 0
}

// endLocked ends slot's entry for key, counted under o.
func (p *predictions) endLocked(slot int, key uint64, o outcome) {
	s := &p.slots[slot]
	if !s.predicted(key) {
		return
	}
	s.at.andNot(key, ^uint64(0)) // shrinks as it empties
	b, bit := slot/64, uint64(1)<<(slot%64)
	p.banks[b].andNot(key, bit)
	p.n.Add(-1)
	switch o {
	case outConfirmed:
		p.st.Confirmed++
	case outExpired:
		p.st.Expired++
	default:
		p.st.Dropped++
	}
	if s.at.len() == 0 {
		s.clear()
		p.has[b] &^= bit
		p.size[slot].Store(0)
	}
}

// predictRun is one Predict's progress across its steps (see addStep).
type predictRun struct {
	slot, blockSize int // slot is -1 before the first step
	started         bool
	now             int64     // the stamp of all the run's entries
	hint            evictHint // makeRoomLocked's note, kept across steps
	added           int
}

// addStep records keys, the next part of a Predict's keys from its end, as
// predicted on r's slot, leaving out those held marks as the engine's own.
// It reports false when predictions are off. ix.mu held for reading and
// p.addMu held, so that no other run's steps come between this run's:
// all its entries share one stamp, and each slot's fifo stays in time
// order. Between steps anything else may run; nothing of a run another
// step leaves behind changes what Match finds, as the steps go from the
// prompt's end and a leading run needs its first block.
func (p *predictions) addStep(r *predictRun, keys []uint64, held *keyTable) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ttl <= 0 {
		return false
	}
	if !r.started {
		r.started, r.now, r.hint = true, p.stampLocked(), evictHint{old: -1}
		if r.now >= p.next.Load() {
			p.sweepLocked(r.now, lockStep)
		}
	}
	b, bit := r.slot/64, uint64(1)<<(r.slot%64)
	s := &p.slots[r.slot]
	// Last block first, so that when the bounds drop part of a prompt's
	// entries, oldest first, its tail goes and its leading run stays.
	// held is looked up a chunk at a time (nothing here writes it), so
	// the CPU overlaps the lookups' cache misses, and before the map: a
	// routed prompt is mostly held already.
	const chunk = 16
	var got [chunk]uint64
	for hi := len(keys); hi > 0; hi -= chunk {
		ck := keys[max(0, hi-chunk):hi]
		held.getMany(ck, got[:len(ck)])
		for j := len(ck) - 1; j >= 0; j-- {
			if got[j]&bit != 0 {
				continue
			}
			if s.predicted(ck[j]) {
				// Predicted already: the entry keeps its first time,
				// so one that is never confirmed ends its TTL after it
				// was first predicted, however many requests it draws
				// meanwhile.
				continue
			}
			p.insertLocked(r.slot, ck[j], r.now, &r.hint)
			r.added++
		}
	}
	if s.entries() == 0 {
		s.clear()
		return true
	}
	p.has[b] |= bit
	p.size[r.slot].Store(int32(r.blockSize))
	p.next.Store(min(p.next.Load(), r.now+int64(p.ttl)))
	return true
}

// insertLocked records key k as predicted on slot at now, making room
// first (h carries makeRoomLocked's scan across one add's inserts).
func (p *predictions) insertLocked(slot int, k uint64, now int64, h *evictHint) {
	s := &p.slots[slot]
	p.makeRoomLocked(slot, h)
	if s.at == nil {
		s.at = new(keyTable) // the slot's first entry
	}
	p.banks[slot/64].or(k, uint64(1)<<(slot%64))
	p.n.Add(1)
	p.st.Inserted++
	s.at.or(k, uint64(now)+1)
	s.fifoK, s.fifoAt = append(s.fifoK, k), append(s.fifoAt, now)
	if len(s.fifoK) >= fifoLimit(s.at.len()) {
		s.compact()
	}
}

// makeRoomLocked drops the oldest entries while slot or the whole set is
// at its bound, before one more is added to slot. h is the add's note of
// where the oldest entries overall are.
func (p *predictions) makeRoomLocked(slot int, h *evictHint) {
	s := &p.slots[slot]
	for s.entries() >= p.perEngine && s.skipStale() {
		p.endLocked(slot, s.fifoK[s.head], outDropped)
	}
	for p.n.Load() >= int64(p.total) {
		// The oldest across engines: a scan of the engines with entries,
		// only ever needed once the whole set is full. The scan also
		// notes the next engine's oldest, and the engine found gives up
		// entries, one per insert, without a new scan while they are no
		// newer than that: within one add nothing else changes the heads
		// (its own entries are the newest), and a prompt's entries share
		// one stamp, so one scan makes room for a whole prompt (a new
		// 128k-token prompt over 64 engines scanned them 8192 times).
		if !h.valid(p) {
			h.scan(p)
			if h.old < 0 {
				return
			}
		}
		o := &p.slots[h.old]
		p.endLocked(h.old, o.fifoK[o.head], outDropped)
	}
}

// evictHint is makeRoomLocked's note, for one add, of the engine holding
// the oldest entry overall and of the oldest entry any other engine holds.
type evictHint struct {
	old    int // -1 before the first scan, or when no engine has entries
	nextAt int64
}

// valid reports whether h.old's oldest entry is still the oldest overall.
func (h *evictHint) valid(p *predictions) bool {
	if h.old < 0 {
		return false
	}
	o := &p.slots[h.old]
	return o.skipStale() && o.fifoAt[o.head] <= h.nextAt
}

// scan finds the engine holding the oldest entry, and the next oldest
// head, over the engines with entries.
func (h *evictHint) scan(p *predictions) {
	h.old, h.nextAt = -1, math.MaxInt64
	oldAt := int64(math.MaxInt64)
	for b, m := range p.has {
		for ; m != 0; m &= m - 1 {
			i := b*64 + bits.TrailingZeros64(m)
			o := &p.slots[i]
			if !o.skipStale() {
				continue
			}
			if at := o.fifoAt[o.head]; at < oldAt {
				h.old, oldAt, h.nextAt = i, at, oldAt
			} else if at < h.nextAt {
				h.nextAt = at
			}
		}
	}
}

// end ends slot's entry for key if there is one: the engine stored the
// block (o outConfirmed) or dropped it. ix.mu held for writing, so no
// Predict runs and size says whether slot has entries.
func (p *predictions) end(slot int, key uint64, o outcome) {
	if p.size[slot].Load() == 0 {
		return
	}
	p.mu.Lock()
	p.endLocked(slot, key, o)
	p.mu.Unlock()
}

// dropSlot ends every entry of slot and returns how many there were.
func (p *predictions) dropSlot(slot int) int {
	if !p.any() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n, _ := p.dropStepLocked(slot, 0)
	return n
}

// dropSteps ends every entry of slot, lockStep at a time, each step under
// its own hold of p.mu: an engine may have 32768, 2.5-4 ms of work, and
// every Match waited for all of it when a request there failed. same,
// when not nil, is asked before each step (with no lock of the
// predictions held) whether the slot is still the engine's; the drop
// stops when it is not. It returns how many entries it ended.
func (p *predictions) dropSteps(slot int, same func() bool) int {
	n := 0
	for p.any() && (same == nil || same()) {
		p.mu.Lock()
		ended, more := p.dropStepLocked(slot, lockStep)
		p.mu.Unlock()
		n += ended
		if !more {
			break
		}
		p.pause()
	}
	return n
}

// dropStepLocked ends up to limit of slot's entries (all of them when
// limit <= 0), oldest first, and reports how many it ended and whether any
// are left. Every live entry has one fifo item, so the fifo reaches them
// all; ending the last one empties the slot.
func (p *predictions) dropStepLocked(slot, limit int) (ended int, more bool) {
	s := &p.slots[slot]
	for (limit <= 0 || ended < limit) && s.skipStale() {
		p.endLocked(slot, s.fifoK[s.head], outDropped)
		ended++
	}
	return ended, p.slots[slot].entries() > 0
}

// setTTL sets the entries' life; d <= 0 drops them all and predicts no
// more.
func (p *predictions) setTTL(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ttl = max(d, 0)
	if p.ttl == 0 {
		for slot := range p.slots {
			p.dropStepLocked(slot, 0)
		}
	}
	p.sweepLocked(p.clockLocked(), 0)
}

func (p *predictions) getTTL() time.Duration {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.ttl
}

func (p *predictions) stats() PredictionStats {
	p.expire()
	p.mu.RLock()
	defer p.mu.RUnlock()
	st := p.st
	st.Live = int(p.n.Load())
	return st
}

// split moves the engines of active that have predictions to pred, for
// walkLocked. p.mu held for reading.
func (p *predictions) split(active, pred []uint64) []uint64 {
	for b := range active {
		pred = append(pred, active[b]&p.has[b])
		active[b] &^= p.has[b]
	}
	return pred
}

// walkLocked appends the matches of the engines in active, as
// Index.walkLocked does, and of those in pred: their leading run of keys
// held or predicted, and how much of it only predictions make up. A bank
// is walked once for both, so its keys are looked up once. ix.mu and p.mu
// held for reading.
func (p *predictions) walkLocked(ix *Index, active, pred []uint64, blockSize int, keys []uint64, out []EngineMatch) []EngineMatch {
	for b := range active {
		if active[b]|pred[b] != 0 {
			out = p.walkBankLocked(ix, b, active[b], pred[b], blockSize, keys, out)
		}
	}
	return out
}

// walkBankLocked is walkLocked for bank b: a its engines without
// predictions, pr those with. Keys are looked up a chunk at a time, as in
// Index.walkLocked, so the CPU overlaps their cache misses; the
// predictions are only consulted for a key the engine does not hold.
func (p *predictions) walkBankLocked(ix *Index, b int, a, pr uint64, blockSize int, keys []uint64, out []EngineMatch) []EngineMatch {
	const chunk = 16
	var got [chunk]uint64
	var realLen [64]int
	t, pt := ix.banks[b], p.banks[b]
	held, merged := pr, pr // held ⊆ merged: a key held is a key held or predicted
	for start := 0; start < len(keys) && a|merged != 0; start += chunk {
		ck := keys[start:min(start+chunk, len(keys))]
		t.getMany(ck, got[:len(ck)])
		for j, r := range got[:len(ck)] {
			at := start + j
			if have := r & a; have != a {
				out, a = ix.emitRun(b, a&^have, at, blockSize, out), have
			}
			if merged == 0 {
				continue
			}
			m := r
			if r&merged != merged {
				m |= pt.get(ck[j])
			}
			for lost := held &^ r; lost != 0; lost &= lost - 1 {
				realLen[bits.TrailingZeros64(lost)] = at
			}
			held &= r
			out = emitPredicted(ix, b, merged&^m, at, &realLen, blockSize, out)
			merged &= m
		}
	}
	out = ix.emitRun(b, a, len(keys), blockSize, out)
	for ; held != 0; held &= held - 1 {
		realLen[bits.TrailingZeros64(held)] = len(keys)
	}
	return emitPredicted(ix, b, merged, len(keys), &realLen, blockSize, out)
}

// emitPredicted appends the engines of bank b in lost, whose run ended
// at n blocks, realLen[i] of them their own.
func emitPredicted(ix *Index, b int, lost uint64, n int, realLen *[64]int, blockSize int, out []EngineMatch) []EngineMatch {
	if n == 0 {
		return out
	}
	for ; lost != 0; lost &= lost - 1 {
		i := bits.TrailingZeros64(lost)
		out = append(out, EngineMatch{Engine: ix.slots[b*64+i].id, Blocks: n, BlockSize: blockSize,
			Tokens: n * blockSize, Predicted: n - realLen[i]})
	}
	return out
}

// SetPredictTTL sets how long a speculative entry lives after it was first
// predicted; d <= 0 turns predictions off and drops every entry. Off until
// set.
func (ix *Index) SetPredictTTL(d time.Duration) { ix.spec.setTTL(d) }

// PredictTTL returns the speculative entries' TTL, 0 when they are off.
func (ix *Index) PredictTTL() time.Duration { return ix.spec.getTTL() }

// Predict records speculative entries: engine is about to hold the blocks
// of keys, a prompt's block keys at blockSize in KV-cache group (Keys or
// RequestKeys), because the gateway has just sent it the prompt. The
// events of a prefill arrive a prefill later; without predictions a burst
// of requests sharing a new prefix scatters over the fleet, each finding
// nobody holding it. The rules:
//   - A predicted block counts as held in the engine's leading-block run
//     (EngineMatch.Blocks); EngineMatch.Predicted says how much of the run
//     only predictions make up.
//   - An entry ends, at the latest, its TTL after it was first predicted
//     (SetPredictTTL): predicting it again does not renew it, so a guess
//     the engine never confirms misleads Match for one TTL at most,
//     however many requests it draws there meanwhile. It ends sooner when the engine's BlockStored
//     confirms the block (a real entry from then on), when a BlockRemoved
//     or an eviction drops it, when the engine's mirror is reset in any
//     way (AllBlocksCleared, a resync, RemoveEngine), when DropPredictions
//     is called for the engine (a request there failed), or when the
//     bounds (IndexConfig.MaxPredicted, MaxPredictedPerEngine) push it out,
//     oldest first and a prompt's last blocks before its first.
//
// Nothing is recorded while predictions are off, for an engine not in the
// index or being reset, or for one whose mirror knows a block size other
// than blockSize (blockSize stands in for an engine that has stored
// nothing yet). Keys the engine holds already are left out, and of the
// keys given at most the first MaxPredictedPerEngine are kept. It returns
// how many new entries it recorded (keys predicted already are not
// counted).
func (ix *Index) Predict(engine string, blockSize, group int, keys []uint64) int {
	if blockSize <= 0 || len(keys) == 0 {
		return 0
	}
	p := ix.spec
	p.expire()
	p.addMu.Lock()
	defer p.addMu.Unlock()
	keys = keys[:min(len(keys), p.perEngine)] // the leading blocks matter
	r := predictRun{slot: -1, blockSize: blockSize}
	for hi := len(keys); hi > 0; hi -= lockStep {
		if !ix.predictStep(engine, group, &r, keys[max(0, hi-lockStep):hi]) {
			break
		}
		if hi > lockStep {
			p.pause()
		}
	}
	return r.added
}

// predictStep is one step of Predict, under the index's read lock; false
// when the engine is gone, not live, of another block size, or was
// removed and added again since the run's first step, or predictions are
// off: the run stops.
func (ix *Index) predictStep(engine string, group int, r *predictRun, keys []uint64) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	m := ix.byID[engine]
	if m == nil || ix.live[m.bank]&m.bit == 0 || (r.slot >= 0 && m.slot != r.slot) {
		return false
	}
	if bs := m.groupBlockSize(group); bs != 0 && bs != r.blockSize {
		return false
	}
	r.slot = m.slot
	return ix.spec.addStep(r, keys, ix.banks[m.bank])
}

// DropPredictions drops every speculative entry of engine at once (a
// request sent there failed, so it may never store them) and returns how
// many there were.
func (ix *Index) DropPredictions(engine string) int {
	ix.mu.RLock()
	m := ix.byID[engine]
	ix.mu.RUnlock()
	if m == nil {
		return 0
	}
	// In steps, without the index's lock across them: the slot is checked
	// to be m's still before each.
	return ix.spec.dropSteps(m.slot, func() bool {
		ix.mu.RLock()
		defer ix.mu.RUnlock()
		return ix.slots[m.slot] == m
	})
}

// PredictionStats returns the speculative entries' counters, expired
// entries ended first.
func (ix *Index) PredictionStats() PredictionStats { return ix.spec.stats() }
