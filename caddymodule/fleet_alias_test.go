package caddymodule

import "github.com/llmgw/caddy-llmgw/fleet"

// The admin API's report types, under the names the tests knew them by
// before the core moved to package fleet.
type (
	engineReport = fleet.EngineReport
	kvReport     = fleet.KVReport
)
