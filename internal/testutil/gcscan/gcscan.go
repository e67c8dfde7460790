// Package gcscan helps tests and benchmarks keep the gateway's long-lived
// tables out of the garbage collector's scan. The collector reads every
// pointer of live memory at each collection, and the tables (the
// approximate prefix tree, a tokenizer's vocabulary) live as long as the
// process: with a pointer per entry they cost every collection
// milliseconds of CPU, however little they change. Memory without
// pointers is not scanned.
package gcscan

import (
	"reflect"
	"runtime"
	"runtime/metrics"
	"testing"
)

// PointerIn names the first part of the types that is or holds a Go
// pointer (a pointer, string, slice, map, channel, function or
// interface), as a path of fields; "" when none does.
func PointerIn(types ...reflect.Type) string {
	for _, typ := range types {
		switch typ.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
			reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		case reflect.Array:
			if p := PointerIn(typ.Elem()); p != "" {
				return typ.String() + ": " + p
			}
		case reflect.Struct:
			for i := range typ.NumField() {
				if p := PointerIn(typ.Field(i).Type); p != "" {
					return typ.String() + "." + typ.Field(i).Name + ": " + p
				}
			}
		default:
			return typ.String()
		}
	}
	return ""
}

// ReportCycleCost runs a full garbage collection per iteration of b and
// reports the collector's CPU per collection as gc-cpu-ms/op: what the
// live heap costs each collection of a running process.
func ReportCycleCost(b *testing.B) {
	runtime.GC()
	c0 := gcCPU()
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric((gcCPU()-c0)/float64(b.N)*1e3, "gc-cpu-ms/op")
}

func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64()
}
