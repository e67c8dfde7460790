package caddymodule

import (
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestAdmissionCaddyfile: llm_admission's Caddyfile options reach the
// handler's JSON — `local_accounting on|off` as disable_local_accounting,
// prefill_rate, long_prefill and engine_queue as numbers — and a bad
// value is an error.
func TestAdmissionCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "llm_admission {\n}", want: `{}`},
		{in: "llm_admission {\n local_accounting off\n}", want: `{"disable_local_accounting":true}`},
		{in: "llm_admission {\n local_accounting off\n local_accounting on\n}", want: `{}`},
		{in: "llm_admission {\n local_accounting maybe\n}", wantErr: true},
		{in: "llm_admission {\n local_accounting\n}", wantErr: true},
		{in: "llm_admission {\n local_accounting off on\n}", wantErr: true},
		{in: "llm_admission {\n prefill_rate 2500\n long_prefill 8192\n}", want: `{"prefill_rate":2500,"long_prefill":8192}`},
		{in: "llm_admission {\n long_prefill -1\n}", want: `{"long_prefill":-1}`},
		{in: "llm_admission {\n long_prefill 16k\n}", wantErr: true},
		{in: "llm_admission {\n long_prefill\n}", wantErr: true},
		{in: "llm_admission {\n max_inflight 16\n engine_queue 1\n}", want: `{"max_inflight":16,"engine_queue":1}`},
		{in: "llm_admission {\n engine_queue one\n}", wantErr: true},
	} {
		var h Admission
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if raw, _ := json.Marshal(&h); string(raw) != tc.want {
			t.Errorf("%q: JSON %s, want %s", tc.in, raw, tc.want)
		}
	}
}
