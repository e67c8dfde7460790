package admission

import (
	"math"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name   string
		pos    int
		rate   float64
		lo, hi time.Duration
		want   time.Duration
	}{
		{"exact", 10, 5, s, 60 * s, 2 * s},
		{"rounds up", 11, 5, s, 60 * s, 3 * s},
		{"clamped to lo", 1, 100, 5 * s, 60 * s, 5 * s},
		{"clamped to hi", 1000, 1, s, 30 * s, 30 * s},
		{"never below 1s", 1, 1000, 0, 0, s},
		{"sub-second lo rounds up", 1, 1000, 200 * time.Millisecond, 0, s},
		{"lo rounds up", 1, 1000, 2500 * time.Millisecond, 0, 3 * s},
		{"hi rounds up", 1000, 1, 0, 2500 * time.Millisecond, 3 * s},
		{"no rate gives hi", 3, 0, s, 20 * s, 20 * s},
		{"negative rate gives hi", 3, -1, s, 20 * s, 20 * s},
		{"NaN rate gives hi", 3, math.NaN(), s, 20 * s, 20 * s},
		{"no rate, no hi gives lo", 3, 0, 7 * s, 0, 7 * s},
		{"no rate, nothing gives 1s", 3, 0, 0, 0, s},
		{"no hi: unbounded", 600, 2, s, 0, 300 * s},
		{"hi below lo: hi wins", 100, 1, 10 * s, 5 * s, 5 * s},
		{"position 0 counts as 1", 0, 0.5, 0, 0, 2 * s},
		{"tiny rate does not overflow", 1 << 40, 1e-300, 0, 0, time.Duration(math.MaxInt64/int64(s)) * s},
		{"infinite rate", 5, math.Inf(1), 0, 10 * s, s},
	}
	for _, tt := range tests {
		if got := RetryAfter(tt.pos, tt.rate, tt.lo, tt.hi); got != tt.want {
			t.Errorf("%s: RetryAfter(%d, %v, %v, %v) = %v, want %v", tt.name, tt.pos, tt.rate, tt.lo, tt.hi, got, tt.want)
		}
	}
}
