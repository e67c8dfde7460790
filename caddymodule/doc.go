// Package caddymodule registers the caddy-llmgw Caddy modules: the llm app,
// the llm_admission handler, the llm selection policy and the admin API.
package caddymodule
