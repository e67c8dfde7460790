// Package admission holds the Caddy-free parts of the llm_admission handler:
//
//   - Gate: a priority-band parking gate. Requests that find no capacity are
//     parked per band (High, Normal, Low), admitted in strict priority order
//     with FIFO inside a band and aging so low bands are not starved, and
//     woken by Kick when capacity may have changed. No goroutine per waiter.
//   - RetryAfter: the Retry-After hint for a request refused after parking.
//   - ParseRequest: a single-pass walk over an OpenAI-style request body that
//     extracts the few fields the gateway needs without decoding messages.
//   - StreamObserver and ParseUsage: TTFT, inter-token gaps, usage and errors
//     from an upstream SSE stream or JSON response, with bounded memory.
//   - KeepAlive, ErrorEvent, ErrorJSON: bytes the handler writes to clients.
package admission
