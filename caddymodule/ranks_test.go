package caddymodule

import (
	"net/http"
	"testing"
)

// TestSetRank: a pick of a rank names it in the proxied request's header,
// a later attempt's pick of another rank rewrites it, and a pick of an
// engine without ranks removes the header an earlier attempt set but
// leaves one the client sent when no rank was ever picked.
func TestSetRank(t *testing.T) {
	steps := []struct {
		name   string
		client string // the client's header, on a fresh request; "" none
		picks  []int  // the attempts' ranks (-1: an engine without ranks)
		want   string // the header after the last attempt ("" absent)
	}{
		{name: "rank", picks: []int{2}, want: "2"},
		{name: "retry on another rank", picks: []int{2, 0}, want: "0"},
		{name: "retry on an engine without ranks", picks: []int{2, -1}, want: ""},
		{name: "client header, no rank picked", client: "5", picks: []int{-1, -1}, want: "5"},
		{name: "client header overwritten by a pick", client: "5", picks: []int{1}, want: "1"},
	}
	for _, tc := range steps {
		t.Run(tc.name, func(t *testing.T) {
			r, err := http.NewRequest(http.MethodPost, "http://gw/v1/completions", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.client != "" {
				r.Header.Set("x-data-parallel-rank", tc.client)
			}
			st := &selectState{}
			for _, rank := range tc.picks {
				st.setRank(r, rank)
			}
			if got := r.Header.Get(rankHeader); got != tc.want {
				t.Fatalf("header %q, want %q", got, tc.want)
			}
		})
	}
}
