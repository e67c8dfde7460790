package localtok

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEncodePaths: both ways of getting the tokenizer's ids into a
// []uint64 append exactly its ids after what dst holds (values beyond
// int64's range included: they are never read as int), whether dst has
// room for them or the tokenizer has to grow it. The in-place way is
// checked only where int is 64 bits wide, the only place encode uses it.
func TestEncodePaths(t *testing.T) {
	m := loadFixture(t, "chatml")
	long := strings.Repeat("hello the world ", 200)
	for _, text := range []string{"", "hello world", long} {
		var want []uint64
		for _, id := range m.tok.Encode(text, true) {
			want = append(want, uint64(id))
		}
		for _, path := range []struct {
			name string
			fn   func(*Model, []uint64, string, bool) []uint64
		}{{"in place", (*Model).encodeInPlace}, {"copied", (*Model).encodeCopied}} {
			if path.name == "in place" && strconv.IntSize != 64 {
				continue // encode never takes it there
			}
			for _, room := range []int{0, 2, len(want) + 8} {
				head := []uint64{math.MaxUint64, 1 << 63}
				dst := append(make([]uint64, 0, len(head)+room), head...)
				got := path.fn(m, dst, text, true)
				if !slices.Equal(got[:2], head) || !slices.Equal(got[2:], want) {
					t.Fatalf("%s, %d bytes of text, room %d: got %d ids, head %v; want head %v and %d ids",
						path.name, len(text), room, len(got), got[:min(2, len(got))], head, len(want))
				}
			}
		}
	}
}
