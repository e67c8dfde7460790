package admission

import (
	"strconv"
	"strings"
)

// Band is a priority band. Lower values are served first, which matches
// vLLM's own request priority convention (0 is the most urgent).
type Band int

// The priority bands, most urgent first.
const (
	High Band = iota
	Normal
	Low
)

// NumBands is the number of priority bands.
const NumBands = 3

// ParseBand parses a band name: "high", "normal" or "low" in any case, with
// surrounding spaces ignored. The numeric forms "0", "1" and "2" are accepted
// too, so a vLLM-style integer priority header maps directly onto a band.
func ParseBand(s string) (Band, bool) {
	s = strings.TrimSpace(s)
	switch {
	case strings.EqualFold(s, "high"):
		return High, true
	case strings.EqualFold(s, "normal"):
		return Normal, true
	case strings.EqualFold(s, "low"):
		return Low, true
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n < NumBands && len(s) == 1 {
		return Band(n), true
	}
	return 0, false
}

// String returns the lower-case band name, or "band(N)" for a value outside
// the defined range.
func (b Band) String() string {
	switch b {
	case High:
		return "high"
	case Normal:
		return "normal"
	case Low:
		return "low"
	}
	return "band(" + strconv.Itoa(int(b)) + ")"
}

// valid reports whether b is one of the defined bands.
func (b Band) valid() bool { return b >= 0 && b < NumBands }
