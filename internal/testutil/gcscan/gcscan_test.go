package gcscan

import (
	"reflect"
	"testing"
)

func TestPointerIn(t *testing.T) {
	type node struct {
		key        uint64
		prev, next int32
	}
	for _, c := range []struct {
		v    any
		want string
	}{
		{node{}, ""},
		{[4]uint64{}, ""},
		{struct{ a, b int32 }{}, ""},
		{struct{ s string }{}, "struct { s string }.s: string"},
		{struct{ n [2]*int }{}, "struct { n [2]*int }.n: [2]*int: *int"},
		{struct{ l []uint64 }{}, "struct { l []uint64 }.l: []uint64"},
		{struct{ m map[int]int }{}, "struct { m map[int]int }.m: map[int]int"},
		{struct{ e any }{}, "struct { e interface {} }.e: interface {}"},
	} {
		if got := PointerIn(reflect.TypeOf(c.v)); got != c.want {
			t.Errorf("PointerIn(%T) = %q, want %q", c.v, got, c.want)
		}
	}
	if got := PointerIn(reflect.TypeOf(uint64(0)), reflect.TypeOf("")); got != "string" {
		t.Errorf("second type: %q", got)
	}
}
