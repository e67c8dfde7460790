// Package caddyllmgw plugs the caddy-llmgw modules into Caddy. Build a Caddy
// binary with them with xcaddy:
//
//	xcaddy build --with github.com/llmgw/caddy-llmgw
//
// The modules themselves live in package caddymodule; this root package only
// imports it so that xcaddy's --with flag brings everything.
package caddyllmgw

import (
	// Register the llm app, the llm_admission handler, the llm selection
	// policy and the admin API.
	_ "github.com/llmgw/caddy-llmgw/caddymodule"
)
