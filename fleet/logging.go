package fleet

import (
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// liveCore is a zapcore.Core that writes through the core of the logger in
// base at the time of each entry, so loggers made once (pollers, KV
// subscriptions) follow the log outputs and levels of later configs.
type liveCore struct {
	base   *atomic.Pointer[zap.Logger]
	fields []zapcore.Field
}

func (c *liveCore) core() zapcore.Core {
	core := c.base.Load().Core()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core
}

// Enabled implements zapcore.LevelEnabler.
func (c *liveCore) Enabled(l zapcore.Level) bool { return c.base.Load().Core().Enabled(l) }

// With implements zapcore.Core.
func (c *liveCore) With(fields []zapcore.Field) zapcore.Core {
	return &liveCore{base: c.base, fields: append(c.fields[:len(c.fields):len(c.fields)], fields...)}
}

// Check implements zapcore.Core: the current core decides (its level and
// its logger-name filters) and is the one that writes.
func (c *liveCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.Enabled(e.Level) {
		return ce
	}
	return c.core().Check(e, ce)
}

// Write implements zapcore.Core; entries normally reach the current core
// through Check.
func (c *liveCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.core().Write(e, fields)
}

// Sync implements zapcore.Core.
func (c *liveCore) Sync() error { return c.base.Load().Core().Sync() }
