package fleet

import (
	"context"
	"fmt"
	"strconv"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/kvindex/zmqsub"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// kvConfig is one engine's KV-event subscription.
type kvConfig struct {
	Endpoint string
	Bind     bool
	Replay   string
	Topic    string
	// Rank is the data-parallel rank the subscription follows, when
	// HasRank: batches of other ranks are counted, not applied.
	Rank    int
	HasRank bool
}

// subscription is a running KV-event subscription, for the admin API.
// Whether its events are live is the mirror's to say
// ([kvindex.Mirror.Connected]).
type subscription struct {
	cfg kvConfig
	sub *zmqsub.Subscriber
}

// kvWorker is the registry's per-engine worker: it keeps the engine's KV
// subscription running while the engine is registered. The registry
// restarts it when the engine's config (its KV attributes included) changes.
func (f *Fleet) kvWorker(ctx context.Context, e *upstreams.Engine) {
	dial := e.Dial()
	cfg := kvFromAttrs(e.Config().Attrs)
	if cfg.Endpoint == "" {
		// A discovered engine: the app-wide ports, if any.
		f.mu.Lock()
		cfg.Endpoint = derivedEndpoint(dial, f.kvEventsPort)
		cfg.Replay = derivedEndpoint(dial, f.kvReplayPort)
		f.mu.Unlock()
	}
	if cfg.Endpoint == "" {
		return
	}
	f.runSubscription(ctx, dial, cfg)
}

// runSubscription mirrors one engine's KV events into the index until ctx
// ends; the engine's mirror lives exactly as long.
func (f *Fleet) runSubscription(ctx context.Context, dial string, cfg kvConfig) {
	log := f.logger.Named("kv").With(zap.String("engine", dial))
	f.mu.Lock()
	verify, hash := f.verifyConfigLocked(), f.engineHashLocked()
	f.mu.Unlock()
	f.index.RemoveEngine(dial) // a mirror left by an earlier subscription is stale
	mirror, err := f.index.AddEngine(dial, kvindex.MirrorConfig{Verify: verify, Hash: hash, Rank: cfg.Rank, HasRank: cfg.HasRank})
	if err != nil {
		log.Error("cannot mirror engine's KV events", zap.Error(err))
		<-ctx.Done()
		return
	}
	defer f.index.RemoveEngine(dial)
	if l := f.registry.Ensure(dial).Load(); l.NumGPUBlocks > 0 {
		mirror.SetCapacity(l.NumGPUBlocks)
	}
	var replay kvindex.Replayer
	if cfg.Replay != "" {
		ep := cfg.Replay
		replay = func(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) error) error {
			return zmqsub.Replay(ctx, ep, start, 0, fn)
		}
	}
	// Backfill: a gateway that subscribes after the engine stored a
	// prefix learns it from the replay buffer (when there is one).
	feed := kvindex.NewFeed(mirror, replay, kvindex.FeedConfig{Backfill: true})
	defer feed.Close()
	sub, err := zmqsub.NewSubscriber(zmqsub.Config{
		Endpoint: cfg.Endpoint,
		Bind:     cfg.Bind,
		Topic:    cfg.Topic,
		Logger:   log,
	})
	if err != nil {
		log.Error("bad KV events endpoint", zap.Error(err))
		<-ctx.Done()
		return
	}
	f.mu.Lock()
	f.subs[dial] = &subscription{cfg: cfg, sub: sub}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, dial)
		f.mu.Unlock()
	}()
	if err := sub.Run(ctx, feed); err != nil {
		log.Error("KV subscription ended", zap.Error(err))
	}
}

// live reports whether dial's KV mirror follows the engine (its events are
// connected and mostly applied), so its blocks can be trusted for routing.
func (f *Fleet) live(dial string) bool {
	live, _ := f.kvState(dial)
	return live
}

// kvState is dial's KV mirror as routing sees it: live (see live), or
// unapplied: its events are connected but mostly not being applied
// (kvindex.Mirror.Trusted), which routing treats as no events.
func (f *Fleet) kvState(dial string) (live, unapplied bool) {
	m := f.index.Mirror(dial)
	if m == nil {
		return false, false
	}
	connected, trusted := m.State()
	return connected && trusted, connected && !trusted
}

func (c kvConfig) attrs() map[string]string {
	if c.Endpoint == "" {
		return nil
	}
	m := map[string]string{"kv_events": c.Endpoint}
	if c.Bind {
		m["kv_bind"] = "true"
	}
	if c.Replay != "" {
		m["kv_replay"] = c.Replay
	}
	if c.Topic != "" {
		m["kv_topic"] = c.Topic
	}
	if c.HasRank {
		m["kv_rank"] = strconv.Itoa(c.Rank)
	}
	return m
}

func kvFromAttrs(m map[string]string) kvConfig {
	c := kvConfig{Endpoint: m["kv_events"], Bind: m["kv_bind"] == "true", Replay: m["kv_replay"], Topic: m["kv_topic"]}
	if v, ok := m["kv_rank"]; ok {
		if r, err := strconv.Atoi(v); err == nil {
			c.Rank, c.HasRank = r, true
		}
	}
	return c
}

// rank is c as data-parallel rank r subscribes to it: both endpoints'
// ports increased by r, as vLLM's rank r publishes, and its batches
// checked for rank r.
func (c kvConfig) rank(r int) (kvConfig, error) {
	var err error
	if c.Endpoint, err = offsetEndpoint(c.Endpoint, r); err != nil {
		return c, fmt.Errorf("kv_events: %w", err)
	}
	if c.Replay, err = offsetEndpoint(c.Replay, r); err != nil {
		return c, fmt.Errorf("kv_replay: %w", err)
	}
	c.Rank, c.HasRank = r, true
	return c, nil
}
