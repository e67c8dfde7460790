package fleet

import (
	"sync"
	"time"
	"weak"

	"github.com/llmgw/caddy-llmgw/upstreams"
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
	// ResponseGone: the engine that stored it restarted or left the fleet
	// since: its memory, with the response, is gone.
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
// the serving process's memory. The engine is remembered as the process
// it is now: once the registry sees it restart, or it leaves the registry,
// its ids are gone.
func (f *Fleet) RecordResponse(id, dial string) {
	if id == "" || dial == "" {
		return
	}
	var eng weak.Pointer[upstreams.Engine]
	if e, ok := f.registry.Get(dial); ok {
		eng = weak.Make(e)
	}
	f.responses.record(id, dial, eng)
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
// the state is ResponseStored, and dial "" otherwise.
func (f *Fleet) PreviousResponse(id string) (dial string, st ResponseState) {
	if id == "" {
		return "", ResponseUnknown
	}
	e, ok := f.responses.lookup(id)
	if !ok {
		return "", ResponseUnknown
	}
	if e.epoch != e.dial.epoch {
		return "", ResponseGone // restarted since
	}
	if e.eng != (weak.Pointer[upstreams.Engine]{}) {
		if cur, ok := f.registry.Get(e.dial.name); !ok || weak.Make(cur) != e.eng {
			return "", ResponseGone // left the registry (and may have come back as another process)
		}
	}
	return e.dial.name, ResponseStored
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
	eng   weak.Pointer[upstreams.Engine]
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
func (s *responseStore) record(id, dial string, eng weak.Pointer[upstreams.Engine]) {
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
	s.queue = append(s.queue, responseEntry{id: id, dial: d, epoch: d.epoch, eng: eng, at: now})
}

// lookup returns id's entry, with its dial's current epoch in e.dial
// read under the lock (the copy's epoch is the recorded one).
func (s *responseStore) lookup(id string) (e responseEntry, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.now())
	seq, ok := s.byID[id]
	if !ok {
		return e, false
	}
	e = s.queue[seq-s.base]
	d := *e.dial
	e.dial = &d
	return e, true
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
