package fleet

import (
	"go.uber.org/zap"
)

// onSleep is the registry's OnSleep: an engine's scrape shows it gone to
// vLLM's sleep mode, or back from it.
//
// Sleep discards the engine's KV cache at either level, and vLLM may
// publish no AllBlocksCleared for it (AsyncLLM resets the prefix cache
// before sleeping only when no block is in use, and a failed reset emits
// nothing), so the gateway drops what it holds for the engine as on a
// reset: the mirror's blocks and orphans, its speculative entries, and
// its approximate-tree entries. While asleep the engine is no candidate
// (see OutOfService). On waking it is dropped once more, for any batch
// applied after the first drop but published before the sleep, and so it
// rejoins cold: its prefix hits come back with the events of the blocks
// it stores from then on.
func (f *Fleet) onSleep(dial string, asleep bool) {
	reason := "wake"
	if asleep {
		reason = "sleep"
	}
	f.dropCache(dial, reason)
	if asleep {
		f.logger.Info("engine asleep: no requests until it wakes; its KV index entries are dropped", zap.String("engine", dial))
	} else {
		f.logger.Info("engine awake: it takes requests again, cold", zap.String("engine", dial))
	}
}

// dropCache forgets every block the gateway believes dial holds, counted
// as a mirror resync with the given reason.
func (f *Fleet) dropCache(dial, reason string) {
	if m := f.index.Mirror(dial); m != nil {
		m.Reset(reason) // its speculative entries go with it
	}
	f.index.DropPredictions(dial)
	f.approx.RemoveEngine(dial)
}

// IsAsleep reports whether the engine's last scrape found it in vLLM's
// sleep mode (see upstreams.Engine.Asleep).
func (f *Fleet) IsAsleep(dial string) bool {
	e, ok := f.registry.Get(dial)
	return ok && e.Asleep()
}

// OutOfService reports whether an engine takes no new requests: drained
// by the operator, or asleep. Admission counts no room on it, parked
// requests do not wait for it and routing does not pick it.
func (f *Fleet) OutOfService(dial string) bool {
	return f.IsDrained(dial) || f.IsAsleep(dial)
}
