// Command caddy is Caddy with the caddy-llmgw modules plugged in. It is the
// binary the demo and the integration tests run; end users can equally build
// one with xcaddy (see xcaddy.sh).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/llmgw/caddy-llmgw/caddymodule"
)

func main() { caddycmd.Main() }
