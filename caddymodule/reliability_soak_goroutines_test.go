package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/goroutines"
)

// The soak's goroutine accounting: what holds the goroutines a gateway has
// after the load that it did not have before it (internal/testutil/goroutines
// counts them by entry function). Open HTTP connections — idle keep-alive
// connections to the engines above all — are the only goroutines a
// healthy gateway may hold more of after the load.

// soakHeldSlack is how many goroutines other than open connections' the
// gateway may hold after the load beyond its count before it: a goroutine
// per subscription being reconnected, a timer about to fire.
const soakHeldSlack = 5

// soakHeld reads the gateway's goroutines by entry function: from the
// Caddy process's admin API, or from this process.
func soakHeld(external bool) (map[string]int, error) {
	if !external {
		return goroutines.Self()
	}
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Get("http://" + adminAddr + "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("goroutine dump: %s", res.Status)
	}
	return goroutines.Entries(io.LimitReader(res.Body, 64<<20))
}
