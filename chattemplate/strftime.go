package chattemplate

import (
	"fmt"
	"strings"
	"time"
)

// strftime formats t like Python's datetime.strftime on Linux, which is
// what transformers' strftime_now global calls (datetime.now().strftime).
// It covers the directives chat templates use (Llama 3's "%d %b %Y" and
// friends) plus glibc's "-" flag that drops padding (%-d). Directives it
// does not know are copied through unchanged, as glibc does.
func strftime(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		if s, ok := strftimeDirective(format[i], t, noPad); ok {
			b.WriteString(s)
			continue
		}
		b.WriteByte('%')
		if noPad {
			b.WriteByte('-')
		}
		b.WriteByte(format[i])
	}
	return b.String()
}

// strftimeDirective expands one directive letter.
func strftimeDirective(c byte, t time.Time, noPad bool) (string, bool) {
	num := func(n, width int) string {
		if noPad {
			return fmt.Sprint(n)
		}
		return fmt.Sprintf("%0*d", width, n)
	}
	switch c {
	case 'Y':
		return fmt.Sprint(t.Year()), true
	case 'y':
		return num(t.Year()%100, 2), true
	case 'm':
		return num(int(t.Month()), 2), true
	case 'd':
		return num(t.Day(), 2), true
	case 'e':
		return fmt.Sprintf("%2d", t.Day()), true
	case 'j':
		return num(t.YearDay(), 3), true
	case 'H':
		return num(t.Hour(), 2), true
	case 'I':
		return num((t.Hour()+11)%12+1, 2), true
	case 'M':
		return num(t.Minute(), 2), true
	case 'S':
		return num(t.Second(), 2), true
	case 'f':
		return fmt.Sprintf("%06d", t.Nanosecond()/1000), true
	case 'p':
		return t.Format("PM"), true
	case 'a':
		return t.Format("Mon"), true
	case 'A':
		return t.Format("Monday"), true
	case 'b', 'h':
		return t.Format("Jan"), true
	case 'B':
		return t.Format("January"), true
	case 'w':
		return fmt.Sprint(int(t.Weekday())), true
	case 'Z':
		return t.Format("MST"), true
	case 'z':
		return t.Format("-0700"), true
	case 'c':
		return t.Format("Mon Jan _2 15:04:05 2006"), true
	case 'x':
		return t.Format("01/02/06"), true
	case 'X':
		return t.Format("15:04:05"), true
	case '%':
		return "%", true
	}
	return "", false
}
