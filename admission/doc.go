// Package admission holds the Caddy-free parking gate of the llm_admission
// handler:
//
//   - Gate: a priority-band parking gate. Requests that find no capacity are
//     parked per band (High, Normal, Low), admitted in strict priority order
//     with FIFO inside a band and aging so low bands are not starved, and
//     woken by Kick when capacity may have changed. No goroutine per waiter.
//   - RetryAfter: the Retry-After hint for a request refused after parking.
//
// The wire format the handler reads and writes is package openai.
package admission
