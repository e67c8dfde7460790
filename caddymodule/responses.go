package caddymodule

import (
	"net/http"
	"slices"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
)

// previousResponse is where a /v1/responses follow-up must go: vLLM keeps
// stored responses in the memory of the process that served them, so a
// request naming a previous_response_id this gateway saw stored (see
// responseRecorder) is pinned to that engine. usable says whether the
// engine may still take the request (a candidate, not drained). gone
// reports an id whose engine restarted, left, or is not usable: no engine
// holds the response any more, and the request is to be answered 404 as
// vLLM would (writeResponseNotFound). An id the gateway did not record
// (another gateway's, or from before this one started) pins nothing:
// the request is routed as any other, and its engine answers. count
// counts the outcome in llmgw_previous_response_total.
func previousResponse(f *fleet.Fleet, req *openai.Request, usable func(dial string) bool, count bool) (pin string, gone bool) {
	if req == nil || req.PreviousResponseID == "" {
		return "", false
	}
	dial, st := f.PreviousResponse(req.PreviousResponseID)
	outcome := "unknown"
	switch {
	case st == fleet.ResponseStored && usable(dial):
		pin, outcome = dial, "pinned"
	case st != fleet.ResponseUnknown:
		gone, outcome = true, "gone"
	}
	if count {
		previousResponseTotal.WithLabelValues(outcome).Inc()
	}
	return pin, gone
}

// pinResponse is previousResponse for admission, among the engines
// serving the request's model that are not drained: it pins the request
// (a.pin) on pools routed by lb_policy llm (other policies route on their
// own: there is no engine to wait for), or answers vLLM's 404 before the
// gate when the response is gone, and then reports done.
func (h *Admission) pinResponse(w http.ResponseWriter, req *openai.Request, serving []string, a *admitted) (done bool) {
	usable := func(d string) bool { return slices.Contains(serving, d) && !h.fleet.OutOfService(d) }
	pin, gone := previousResponse(h.fleet, req, usable, true)
	if gone {
		// No engine holds the response any more, and any other would
		// answer as if it never existed.
		a.outcome = "response_not_found"
		writeResponseNotFound(w, req.PreviousResponseID)
		return true
	}
	if _, llm := h.fleet.PolicyOf(h.Pool); llm && pin != "" {
		a.pin, a.prev = pin, req.PreviousResponseID
	}
	return false
}

// writeResponseNotFound answers a follow-up whose previous response is
// gone with vLLM's own 404 for an id it does not hold.
func writeResponseNotFound(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write(openai.ResponseNotFoundJSON(id))
}

// lateResponseGone answers a pinned request the gate let out because the
// engine holding its previous response restarted or left while it waited
// (see Admission.try): vLLM's 404, or, when it parked as a stream and the
// SSE 200 is out, the same error as an event.
func lateResponseGone(w http.ResponseWriter, id string, a *admitted) {
	a.outcome = "response_not_found"
	if !a.sseSent {
		writeResponseNotFound(w, id)
		return
	}
	_, _ = w.Write(openai.ErrorEvent("Response with id '"+id+"' not found.", http.StatusNotFound))
	flush(w)
}

// responseRecorder returns the function that records, for a /v1/responses
// request whose response the engine stores (store not false), the id of
// its answer against the engine that served it (servedBy r); nil for any
// other request.
func responseRecorder(f *fleet.Fleet, r *http.Request, req *openai.Request) func(id string) {
	if req == nil || openai.EndpointOf(r.URL.Path) != openai.EndpointResponses || (req.Store != nil && !*req.Store) {
		return nil
	}
	return func(id string) { f.RecordResponse(id, servedBy(r)) }
}

// upstreamUsable says whether dial is among ups, for previousResponse.
func upstreamUsable(ups ...[]*reverseproxy.Upstream) func(dial string) bool {
	return func(dial string) bool {
		for _, us := range ups {
			if slices.ContainsFunc(us, func(u *reverseproxy.Upstream) bool { return u.Dial == dial }) {
				return true
			}
		}
		return false
	}
}
