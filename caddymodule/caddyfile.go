package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/llmgw/caddy-llmgw/fleet"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("llm", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("llm_admission", parseAdmission)
	httpcaddyfile.RegisterDirectiveOrder("llm_admission", httpcaddyfile.Before, "reverse_proxy")
	// llm_models answers by itself, like respond: with a matcher at the
	// top of a site it must run before llm_admission and reverse_proxy.
	httpcaddyfile.RegisterHandlerDirective("llm_models", parseModelsHandler)
	httpcaddyfile.RegisterDirectiveOrder("llm_models", httpcaddyfile.Before, "respond")
}

// parseGlobalOption parses the `llm` global option into the llm app.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if existing != nil {
		// A second `llm` block extends the first.
		prev, ok := existing.(httpcaddyfile.App)
		if !ok {
			return nil, d.Errf("unexpected existing llm value %T", existing)
		}
		if err := caddy.StrictUnmarshalJSON(prev.Value, app); err != nil {
			return nil, err
		}
	}
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "llm", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	llm {
//	    poll_interval        <duration>
//	    poll_timeout         <duration>
//	    models_interval      <duration>
//	    stale_after          <n>
//	    kv_events_port       <port>
//	    kv_replay_port       <port>
//	    hash_seed            <PYTHONHASHSEED>
//	    hash_algo            sha256_cbor|llmd_fnv64a_cbor
//	    idle_ttl             <duration>
//	    tokenize_timeout     <duration>
//	    tokenize_concurrency <n>
//	    tokenize_cache_size  <n>
//	    speculative_ttl      <duration>
//	    responses_ttl        <duration>
//	    tokenizer <model|*> <dir|remote> [<image_token_id>]
//	    tokenizer_check_sample   <0..1>
//	    tokenizer_mismatch_limit <n>
//	    alias <public> <served>
//	    engine <dial> {
//	        metrics      <url>
//	        tokenize     <url>
//	        models_url   <url>
//	        models       <model...>
//	        max_inflight <n>
//	        kv_events    [bind] <tcp://host:port>
//	        kv_replay    <tcp://host:port>
//	        kv_topic     <prefix>
//	        api_key      <key>
//	        pool         <name>
//	        data_parallel_size <n>
//	    }
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "llm"
	if d.NextArg() {
		return d.ArgErr()
	}
	durations := map[string]*caddy.Duration{
		"poll_interval":    &a.PollInterval,
		"poll_timeout":     &a.PollTimeout,
		"models_interval":  &a.ModelsInterval,
		"idle_ttl":         &a.IdleTTL,
		"tokenize_timeout": &a.TokenizeTimeout,
		"responses_ttl":    &a.ResponsesTTL,
	}
	ints := map[string]*int{
		"stale_after":          &a.StaleAfter,
		"kv_events_port":       &a.KVEventsPort,
		"kv_replay_port":       &a.KVReplayPort,
		"tokenize_concurrency": &a.TokenizeConcurrency,
		"tokenize_cache_size":  &a.TokenizeCacheSize,
	}
	for d.NextBlock(0) {
		var err error
		if v, ok := durations[d.Val()]; ok {
			err = parseDuration(d, v)
		} else if v, ok := ints[d.Val()]; ok {
			err = parseInt(d, v)
		} else {
			err = a.unmarshalOption(d)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalOption parses one llm subdirective other than the plain
// durations and integers.
func (a *App) unmarshalOption(d *caddyfile.Dispenser) error {
	var err error
	switch d.Val() {
	case "hash_seed":
		var s string
		err = parseString(d, &s)
		a.HashSeed = &s
	case "hash_algo":
		err = parseString(d, &a.HashAlgo)
	case "speculative_ttl":
		a.SpeculativeTTL = new(caddy.Duration)
		err = parseDuration(d, a.SpeculativeTTL)
	case "tokenizer":
		args := d.RemainingArgs()
		if len(args) != 2 && len(args) != 3 {
			return d.ArgErr()
		}
		tc := &fleet.TokenizerConfig{Model: args[0], Dir: args[1]}
		if len(args) == 3 {
			id, perr := strconv.ParseUint(args[2], 10, 64)
			if perr != nil || id == 0 {
				return d.Errf("bad image token id '%s'", args[2])
			}
			tc.ImageTokenID = id
		}
		a.Tokenizers = append(a.Tokenizers, tc)
	case "tokenizer_check_sample":
		a.TokenizerCheckSample = new(float64)
		err = parseFloat(d, a.TokenizerCheckSample)
	case "tokenizer_mismatch_limit":
		a.TokenizerMismatchLimit = new(int)
		err = parseInt(d, a.TokenizerMismatchLimit)
	case "alias":
		err = a.parseAlias(d)
	case "engine":
		var e *fleet.EngineConfig
		if e, err = parseEngine(d); err == nil {
			a.Engines = append(a.Engines, e)
		}
	default:
		return d.Errf("unrecognized llm subdirective '%s'", d.Val())
	}
	return err
}

// parseAlias parses `alias <public> <served>`. A public name given twice
// is an error: the Caddyfile would otherwise keep one silently.
func (a *App) parseAlias(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return d.Errf("usage: alias <public model name> <served model name>")
	}
	if prev, dup := a.Aliases[args[0]]; dup {
		return d.Errf("alias '%s' given twice (already for '%s')", args[0], prev)
	}
	if a.Aliases == nil {
		a.Aliases = make(map[string]string)
	}
	a.Aliases[args[0]] = args[1]
	return nil
}

func parseEngine(d *caddyfile.Dispenser) (*fleet.EngineConfig, error) {
	e := new(fleet.EngineConfig)
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	e.Dial = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "metrics":
			err = parseString(d, &e.Metrics)
		case "tokenize":
			err = parseString(d, &e.Tokenize)
		case "models_url":
			err = parseString(d, &e.ModelsURL)
		case "models":
			e.Models = append(e.Models, d.RemainingArgs()...)
			if len(e.Models) == 0 {
				return nil, d.ArgErr()
			}
		case "max_inflight":
			err = parseInt(d, &e.MaxInflight)
		case "data_parallel_size":
			err = parseInt(d, &e.DataParallelSize)
		case "kv_events":
			args := d.RemainingArgs()
			switch {
			case len(args) == 1:
				e.KVEvents = args[0]
			case len(args) == 2 && args[0] == "bind":
				e.KVEventsBind, e.KVEvents = true, args[1]
			default:
				return nil, d.Errf("usage: kv_events [bind] <tcp://host:port>")
			}
		case "kv_replay":
			err = parseString(d, &e.KVReplay)
		case "kv_topic":
			err = parseString(d, &e.KVTopic)
		case "api_key":
			err = parseString(d, &e.APIKey)
		case "pool":
			err = parseString(d, &e.Pool)
		default:
			return nil, d.Errf("unrecognized engine subdirective '%s'", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return e, nil
}

func parseAdmission(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	a := new(Admission)
	err := a.UnmarshalCaddyfile(h.Dispenser)
	return a, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	llm_admission [<matcher>] {
//	    max_body             <size>
//	    body_timeout         <duration>
//	    kv_limit             <0..1>
//	    max_inflight         <n>
//	    max_park             <duration>
//	    queue_size           <n>
//	    heartbeat            <duration>
//	    aging                <duration>
//	    priority_header      <name>
//	    warmup_header        <name>
//	    forward_band_headers
//	    pool                 <name>
//	    engines              <dial...>
//	    models               <model...>
//	    fail_closed
//	    local_accounting     on|off
//	}
func (h *Admission) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "llm_admission"
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "max_body":
			err = parseSize(d, &h.MaxBody)
		case "body_timeout":
			err = parseDuration(d, &h.BodyTimeout)
		case "kv_limit":
			err = parseFloat(d, &h.KVLimit)
		case "max_inflight":
			err = parseInt(d, &h.MaxInflight)
		case "prefill_rate":
			err = parseFloat(d, &h.PrefillRate)
		case "long_prefill":
			err = parseInt(d, &h.LongPrefill)
		case "engine_queue":
			err = parseInt(d, &h.EngineQueue)
		case "max_park":
			err = parseDuration(d, &h.MaxPark)
		case "queue_size":
			err = parseInt(d, &h.QueueSize)
		case "heartbeat":
			err = parseDuration(d, &h.Heartbeat)
		case "aging":
			err = parseDuration(d, &h.Aging)
		case "priority_header":
			err = parseString(d, &h.PriorityHeader)
		case "warmup_header":
			err = parseString(d, &h.WarmupHeader)
		case "forward_band_headers":
			err = parseFlag(d, &h.ForwardBandHeaders)
		case "pool":
			err = parseString(d, &h.Pool)
		case "engines":
			h.Engines = append(h.Engines, d.RemainingArgs()...)
			if len(h.Engines) == 0 {
				return d.ArgErr()
			}
		case "models":
			h.Models = append(h.Models, d.RemainingArgs()...)
			if len(h.Models) == 0 {
				return d.ArgErr()
			}
		case "fail_closed":
			err = parseFlag(d, &h.FailClosed)
		case "local_accounting":
			err = parseOff(d, &h.DisableLocalAccounting)
		default:
			return d.Errf("unrecognized llm_admission subdirective '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	lb_policy llm {
//	    prefix_weight       <float>
//	    approximate_weight  <float>
//	    queue_weight        <float>
//	    running_weight      <float>
//	    work_weight         <float>
//	    prefill_rate        <float>
//	    step_seconds        <float>
//	    slot_steps          <float>
//	    kv_weight           <float>
//	    kv_limit            <float>
//	    epsilon             <float>
//	    bounded_load_min    <float>
//	    imbalance_threshold <float>
//	    tie_tokens          <float>
//	    adapter_weight      <float>
//	    cpu_tier_weight     <float>
//	    storage_tier_weight <float>
//	    cache_key_header    <name>
//	    pool                <name>
//	    block_size          <n>
//	    disable_tokenize
//	    max_body            <size>
//	    breaker_failures    <n>
//	    breaker_cooldown    <duration>
//	    debug_headers
//	}
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "llm"
	if d.NextArg() {
		return d.ArgErr()
	}
	floats := map[string]*float64{
		"prefix_weight":       &p.PrefixWeight,
		"approximate_weight":  &p.ApproximateWeight,
		"queue_weight":        &p.QueueWeight,
		"running_weight":      &p.RunningWeight,
		"work_weight":         &p.WorkWeight,
		"prefill_rate":        &p.PrefillRate,
		"step_seconds":        &p.StepSeconds,
		"slot_steps":          &p.SlotSteps,
		"kv_weight":           &p.KVWeight,
		"kv_limit":            &p.KVLimit,
		"epsilon":             &p.Epsilon,
		"bounded_load_min":    &p.BoundedLoadMin,
		"imbalance_threshold": &p.ImbalanceThreshold,
		"tie_tokens":          &p.TieTokens,
		"adapter_weight":      &p.AdapterWeight,
		"cpu_tier_weight":     &p.CPUTierWeight,
		"storage_tier_weight": &p.StorageTierWeight,
	}
	for d.NextBlock(0) {
		var err error
		if f, ok := floats[d.Val()]; ok {
			if err := parseFloat(d, f); err != nil {
				return err
			}
			continue
		}
		switch d.Val() {
		case "cache_key_header":
			err = parseString(d, &p.CacheKeyHeader)
		case "pool":
			err = parseString(d, &p.Pool)
		case "block_size":
			err = parseInt(d, &p.BlockSize)
		case "disable_tokenize":
			err = parseFlag(d, &p.DisableTokenize)
		case "max_body":
			err = parseSize(d, &p.MaxBody)
		case "breaker_failures":
			err = parseInt(d, &p.BreakerFailures)
		case "breaker_cooldown":
			err = parseDuration(d, &p.BreakerCooldown)
		case "debug_headers":
			err = parseFlag(d, &p.DebugHeaders)
		default:
			return d.Errf("unrecognized lb_policy llm subdirective '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// The helpers below read exactly one argument of a subdirective, so a
// missing or extra argument is an error naming the line.

func parseString(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func parseFlag(d *caddyfile.Dispenser, dst *bool) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	*dst = true
	return nil
}

func parseInt(d *caddyfile.Dispenser, dst *int) error {
	var s string
	if err := parseString(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return d.Errf("bad number '%s'", s)
	}
	*dst = n
	return nil
}

func parseFloat(d *caddyfile.Dispenser, dst *float64) error {
	var s string
	if err := parseString(d, &s); err != nil {
		return err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return d.Errf("bad number '%s': %v", s, err)
	}
	*dst = f
	return nil
}

func parseDuration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	var s string
	if err := parseString(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("bad duration '%s': %v", s, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// parseSize accepts plain bytes (1048576) or units (1MiB, 1MB).
func parseSize(d *caddyfile.Dispenser, dst *int64) error {
	var s string
	if err := parseString(d, &s); err != nil {
		return err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n > 1<<40 {
		return d.Errf("bad size '%s'", s)
	}
	*dst = int64(n)
	return nil
}

// parseOff parses a directive's "on" or "off", setting off.
func parseOff(d *caddyfile.Dispenser, off *bool) error {
	name := d.Val()
	var v string
	if err := parseString(d, &v); err != nil {
		return err
	}
	switch v {
	case "on":
		*off = false
	case "off":
		*off = true
	default:
		return d.Errf("%s must be on or off, got '%s'", name, v)
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Admission)(nil)
	_ caddyfile.Unmarshaler = (*Policy)(nil)
)
