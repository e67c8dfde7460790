package testdep

import (
	"errors"
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	missing := errors.New("No module named 'zmq'")
	for _, c := range []struct {
		name      string
		ci        bool
		err       error
		wantFatal bool
		wantMsg   string // substring; "" means no message at all
	}{
		{"present, CI", true, nil, false, ""},
		{"present, local", false, nil, false, ""},
		{"missing, CI", true, missing, true, "missing under CI"},
		{"missing, local", false, missing, false, "SKIPPING"},
	} {
		fatal, msg := Dep{What: "the peer", Hint: "apt-get install it"}.verdict(c.ci, c.err)
		if fatal != c.wantFatal || (c.wantMsg == "") != (msg == "") || !strings.Contains(msg, c.wantMsg) {
			t.Errorf("%s: verdict = %v %q, want fatal %v and a message containing %q", c.name, fatal, msg, c.wantFatal, c.wantMsg)
		}
		if c.err != nil && !strings.Contains(msg, c.err.Error()) {
			t.Errorf("%s: message %q does not say why (%v)", c.name, msg, c.err)
		}
	}
}
