package admission

import (
	"runtime"
	"testing"
	"time"
)

func BenchmarkGateEnterFastPath(b *testing.B) {
	g := NewGate(Config{})
	try := func() bool { return true }
	b.ReportAllocs()
	for b.Loop() {
		w, err := g.Enter(Normal, try)
		if err != nil || !w.Leave() {
			b.Fatal("not admitted")
		}
	}
}

func BenchmarkGateKickEmpty(b *testing.B) {
	g := NewGate(Config{})
	b.ReportAllocs()
	for b.Loop() {
		g.Kick()
	}
}

// BenchmarkGateParkKick measures one request parking and being admitted by
// Kick behind 100 others in lower bands.
func BenchmarkGateParkKick(b *testing.B) {
	g := NewGate(Config{QueueSize: 1 << 20})
	no := func() bool { return false }
	for range 100 {
		if _, err := g.Enter(Low, no); err != nil {
			b.Fatal(err)
		}
	}
	free := 0
	try := func() bool {
		if free > 0 {
			free--
			return true
		}
		return false
	}
	b.ReportAllocs()
	for b.Loop() {
		w, err := g.Enter(Normal, try)
		if err != nil {
			b.Fatal(err)
		}
		free = 1
		if g.kick() != 1 || !isReady(w) {
			b.Fatal("not admitted")
		}
	}
}

// BenchmarkGateParked10k parks 10,000 waiters and reports the memory each
// costs: allocated bytes, and heap still in use while they are parked.
func BenchmarkGateParked10k(b *testing.B) {
	const n = 10000
	no := func() bool { return false }
	var ms0, ms1 runtime.MemStats
	var total, live uint64
	rounds := 0
	b.ReportAllocs()
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		g := NewGate(Config{QueueSize: n})
		ws := make([]*Waiter, 0, n) // the handler holds each *Waiter; not counted
		runtime.ReadMemStats(&ms1)
		base := ms1.TotalAlloc - ms0.TotalAlloc
		for i := range n {
			w, err := g.Enter(Band(i%NumBands), no)
			if err != nil {
				b.Fatal(err)
			}
			ws = append(ws, w)
		}
		runtime.ReadMemStats(&ms1)
		total += ms1.TotalAlloc - ms0.TotalAlloc - base
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		live += ms1.HeapAlloc - ms0.HeapAlloc - uint64(cap(ws))*8
		rounds++
		runtime.KeepAlive(ws)
		runtime.KeepAlive(g)
	}
	b.ReportMetric(float64(total)/float64(rounds*n), "alloc-B/waiter")
	b.ReportMetric(float64(live)/float64(rounds*n), "live-B/waiter")
}

func BenchmarkPosition10k(b *testing.B) {
	g := NewGate(Config{QueueSize: 1 << 20, Aging: time.Hour})
	no := func() bool { return false }
	var mid *Waiter
	for i := range 10000 {
		w, _ := g.Enter(Band(i%NumBands), no)
		if i == 5000 {
			mid = w
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if mid.Position() == 0 {
			b.Fatal("no position")
		}
	}
}
