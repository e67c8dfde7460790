package fleet

import (
	"sync"
	"time"
)

// Bounds of the previous_response_id affinity map (see [Fleet.RecordResponse]).
const (
	// DefaultMaxResponses is how many response ids the fleet remembers.
	// An entry is its id (37 bytes for vLLM's, at most
	// openai.MaxResponseID), a few words, its map slot and its share of
	// the queue's spare capacity: about 200 bytes with vLLM's ids
	// (measured), so the map holds at most some 20 MB (30 MB with the
	// longest ids). The oldest entry goes first.
	DefaultMaxResponses = 100_000
	// DefaultResponseTTL is how long an id is remembered after its
	// response.
	DefaultResponseTTL = time.Hour
)

// ResponseState is what the fleet knows of a previous_response_id.
type ResponseState int

const (
	// ResponseUnknown: the id was not recorded (another gateway's, from
	// before this one started, or forgotten past its TTL or the bound):
	// the request is routed as any other.
	ResponseUnknown ResponseState = iota
	// ResponseStored: the engine that stored the response still runs the
	// process that stored it, as far as the fleet knows.
	ResponseStored
	// ResponseGone: the engine that stored it restarted since: its
	// memory, with the response, is gone.
	ResponseGone
)

// String is the state's name, as the metrics label it.
func (s ResponseState) String() string {
	switch s {
	case ResponseStored:
		return "stored"
	case ResponseGone:
		return "gone"
	}
	return "unknown"
}

// RecordResponse notes that the engine dial stored the response id (a
// /v1/responses answer with store not false), so that a follow-up naming
// it as previous_response_id goes there: vLLM keeps stored responses in
// the serving process's memory. Once the registry sees the engine
// restart, its ids recorded before are gone.
func (f *Fleet) RecordResponse(id, dial string) {
	if id == "" || dial == "" {
		return
	}
	f.responses.record(id, dial)
}

// SetResponseTTL sets how long a recorded id is remembered (the llm app's
// responses_ttl, at each config start); ttl <= 0 means
// DefaultResponseTTL. Ids already older are forgotten at once.
func (f *Fleet) SetResponseTTL(ttl time.Duration) {
	if ttl <= 0 {
		ttl = DefaultResponseTTL
	}
	f.responses.mu.Lock()
	defer f.responses.mu.Unlock()
	f.responses.ttl = ttl
	f.responses.expire(f.now())
}

// PreviousResponse says where the response id was stored: on dial when
// the state is ResponseStored, and dial "" otherwise. Whether dial may
// still take the request (it left the pool, is drained) is the caller's
// to check. An engine that left the registry and came back at the same
// address is taken for the same process unless a restart was seen (the
// registry forgets idle discovered engines that may still be running):
// should it be another, it answers the follow-up as it would anyway,
// with the 404 of an id it does not hold.
func (f *Fleet) PreviousResponse(id string) (dial string, st ResponseState) {
	if id == "" {
		return "", ResponseUnknown
	}
	d, epoch, current, ok := f.responses.lookup(id)
	switch {
	case !ok:
		return "", ResponseUnknown
	case epoch != current:
		return "", ResponseGone // restarted since
	}
	return d, ResponseStored
}

// responseStore is the bounded id → engine map behind RecordResponse:
// entries in a queue in the order they were recorded, which is also the
// order they expire in, and a map from id to position.
type responseStore struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	now   func() time.Time
	queue []responseEntry // oldest first
	base  uint64          // the sequence number of queue[0]
	byID  map[string]uint64
	dials map[string]*responseDial
}

// responseEntry is one recorded id. A dead entry (id "") was recorded
// again later: it only waits for its turn to leave the queue.
type responseEntry struct {
	id    string
	dial  *responseDial
	epoch uint64 // dial's epoch when recorded
	at    time.Time
}

// responseDial is an engine's shared part of its entries: its dial
// (stored once) and its restart epoch.
type responseDial struct {
	name    string
	epoch   uint64 // bumped at each restart the registry notices
	entries int
}

func newResponseStore(maxEntries int, ttl time.Duration, now func() time.Time) *responseStore {
	return &responseStore{max: maxEntries, ttl: ttl, now: now, byID: make(map[string]uint64), dials: make(map[string]*responseDial)}
}

// record adds or replaces id's entry.
func (s *responseStore) record(id, dial string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max <= 0 {
		return
	}
	now := s.now()
	s.expire(now)
	if seq, ok := s.byID[id]; ok {
		s.queue[seq-s.base].id = "" // dead: the new entry replaces it
	}
	for len(s.queue) >= s.max {
		s.pop()
	}
	d := s.dials[dial]
	if d == nil {
		d = &responseDial{name: dial}
		s.dials[dial] = d
	}
	d.entries++
	s.byID[id] = s.base + uint64(len(s.queue))
	s.queue = append(s.queue, responseEntry{id: id, dial: d, epoch: d.epoch, at: now})
}

// lookup returns the engine that stored id, the epoch it was recorded in
// and the engine's current epoch.
func (s *responseStore) lookup(id string) (dial string, epoch, current uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.now())
	seq, ok := s.byID[id]
	if !ok {
		return "", 0, 0, false
	}
	e := &s.queue[seq-s.base]
	return e.dial.name, e.epoch, e.dial.epoch, true
}

// restarted forgets the ids dial stored before its restart: a lookup finds
// them gone until they leave the queue.
func (s *responseStore) restarted(dial string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.dials[dial]; d != nil {
		d.epoch++
	}
}

// expire drops the entries older than the TTL.
func (s *responseStore) expire(now time.Time) {
	for len(s.queue) > 0 && now.Sub(s.queue[0].at) >= s.ttl {
		s.pop()
	}
}

// pop drops the oldest entry.
func (s *responseStore) pop() {
	e := &s.queue[0]
	if e.id != "" {
		delete(s.byID, e.id)
	}
	if e.dial.entries--; e.dial.entries == 0 {
		delete(s.dials, e.dial.name) // no entry needs its epoch any more
	}
	*e = responseEntry{} // let the id's memory go
	s.queue = s.queue[1:]
	s.base++
	if len(s.queue) == 0 {
		s.queue = s.queue[:0:0] // and the array's
	}
}

// len is the number of live entries.
func (s *responseStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}
