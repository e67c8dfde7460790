package vllmsim

import "sync"

// maxStoredResponseBytes bounds the memory of the stored responses: a long
// previous_response_id chain stores its whole conversation with every turn.
const maxStoredResponseBytes = 64 << 20

// storedResponse is what a follow-up's previous_response_id brings back: the
// conversation the response answered (vLLM's msg_store entry) and its
// output text.
type storedResponse struct {
	messages []chatMessage
	output   string
	size     int
}

// responseStore keeps the most recent responses of one engine, as vLLM's
// serving process keeps them in its memory: at most max of them and about
// maxBytes in all, the oldest evicted first. A nil store (max < 0) keeps
// nothing.
type responseStore struct {
	mu       sync.Mutex
	max      int
	maxBytes int
	byID     map[string]*storedResponse
	order    []string // ids, oldest first
	bytes    int
}

func newResponseStore(max, maxBytes int) *responseStore {
	return &responseStore{max: max, maxBytes: maxBytes, byID: make(map[string]*storedResponse)}
}

// enabled reports whether responses are stored at all.
func (s *responseStore) enabled() bool { return s.max > 0 }

// put stores a response, evicting the oldest ones beyond the bounds. A
// response larger than the byte bound is not stored.
func (s *responseStore) put(id string, msgs []chatMessage, output string) {
	if !s.enabled() {
		return
	}
	size := len(id) + len(output) + 64
	for _, m := range msgs {
		size += len(m.Role) + len(m.Content) + len(m.Name) + len(m.ToolCalls) + 64
	}
	if size > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byID[id]; ok {
		s.bytes -= old.size
	} else {
		s.order = append(s.order, id)
	}
	s.byID[id] = &storedResponse{messages: msgs, output: output, size: size}
	s.bytes += size
	for len(s.order) > 0 && (len(s.byID) > s.max || s.bytes > s.maxBytes) {
		oldest := s.order[0]
		s.order[0] = ""
		s.order = s.order[1:]
		if r, ok := s.byID[oldest]; ok {
			s.bytes -= r.size
			delete(s.byID, oldest)
		}
	}
}

// get returns a stored response.
func (s *responseStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	return r, ok
}

// len is the number of stored responses.
func (s *responseStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// clear forgets every response, as a restarted process does.
func (s *responseStore) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.byID)
	s.order = nil
	s.bytes = 0
}
