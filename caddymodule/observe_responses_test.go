package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/openai"
)

// orderWriter is a ResponseWriter that notes, at each write, the ids
// recorded so far: what the client could have known of them.
type orderWriter struct {
	*httptest.ResponseRecorder
	recorded *[]string
	seen     []int // len(*recorded) at each write
}

func (w *orderWriter) Write(p []byte) (int, error) {
	w.seen = append(w.seen, len(*w.recorded))
	return w.ResponseRecorder.Write(p)
}

// TestObservingWriterRecordsResponseID: the id of a Responses answer is
// recorded, once, before the bytes that carry it (a stream's
// response.created) or complete it (a JSON body) reach the client, however
// the body is split; error answers record nothing.
func TestObservingWriterRecordsResponseID(t *testing.T) {
	body := `{"id":"resp_42","object":"response","output":[],"usage":{"input_tokens":3,"output_tokens":1}}`
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_42\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
	tests := []struct {
		name, contentType string
		status            int
		parts             []string
		want              []string // recorded ids
		firstKnown        int      // the first write at which the id is known
	}{
		{"json whole", "application/json", 200, []string{body}, []string{"resp_42"}, 0},
		{"json split in the id", "application/json", 200, []string{body[:10], body[10:30], body[30:]}, []string{"resp_42"}, 1},
		{"stream", "text/event-stream", 200, []string{stream[:20], stream[20:]}, []string{"resp_42"}, 1},
		{"error", "application/json", 400, []string{`{"id":"resp_42"}`}, nil, -1},
	}
	for _, tt := range tests {
		var recorded []string
		rec := &orderWriter{ResponseRecorder: httptest.NewRecorder(), recorded: &recorded}
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
		// (finish is not called: the metrics are the integration tests'.)
		ow := newObservingWriter(rec, r, false, time.Now(), "sim-model")
		ow.record = func(id string) { recorded = append(recorded, id) }
		ow.Header().Set("Content-Type", tt.contentType)
		ow.WriteHeader(tt.status)
		for _, p := range tt.parts {
			_, _ = ow.Write([]byte(p))
		}
		if strings.Join(recorded, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: recorded %q, want %q", tt.name, recorded, tt.want)
		}
		for i, n := range rec.seen {
			if known := n > 0; known != (tt.firstKnown >= 0 && i >= tt.firstKnown) {
				t.Errorf("%s: at write %d the id was known: %v (first known at write %d)", tt.name, i, known, tt.firstKnown)
			}
		}
	}
}

// TestResponseRecorder: only /v1/responses requests whose response is
// stored get a recorder.
func TestResponseRecorder(t *testing.T) {
	no, yes := false, true
	for _, tt := range []struct {
		path  string
		store *bool
		want  bool
	}{
		{"/v1/responses", nil, true},
		{"/v1/responses", &yes, true},
		{"/v1/responses", &no, false},
		{"/v1/chat/completions", nil, false},
		{"/v1/messages", nil, false},
	} {
		r := httptest.NewRequest(http.MethodPost, tt.path, nil)
		got := responseRecorder(nil, r, &openai.Request{Store: tt.store}) != nil
		if got != tt.want {
			t.Errorf("%s store %v: recorder %v, want %v", tt.path, tt.store, got, tt.want)
		}
	}
}
