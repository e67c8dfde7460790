package tokconformance

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/chattemplate"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
	"github.com/llmgw/caddy-llmgw/tokenizer"
)

// exact lists the models whose every vector must match. The others report
// a match rate, and each of their mismatches must be a listed exception.
var exact = map[string]bool{"qwen3": true, "llama3_1": true, "deepseek_v3": true, "gptoss": true}

// maxReported bounds the mismatches printed per model and section; the
// count of all of them is printed too.
const maxReported = 15

type vectorFile struct {
	Format int    `json:"format"`
	Name   string `json:"name"`
	Source struct {
		Package   string `json:"package"`
		Version   string `json:"version"`
		Integrity string `json:"integrity"`
	} `json:"source"`
	Reference    map[string]string `json:"reference"`
	Now          string            `json:"now"`
	Special      map[string]string `json:"special"`
	ChatTemplate struct {
		Present bool   `json:"present"`
		Note    string `json:"note"`
	} `json:"chat_template"`
	Texts []textVector `json:"texts"`
	Chats []chatVector `json:"chats"`
}

type textVector struct {
	Kind           string `json:"kind"`
	Text           string `json:"text"`
	IDs            []int  `json:"ids"`
	IDsWithSpecial []int  `json:"ids_with_special"` // nil: not recorded
}

type chatVector struct {
	Kind                 string          `json:"kind"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  bool            `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Kwargs               map[string]any  `json:"kwargs"`
	Text                 string          `json:"text"`
	IDs                  []int           `json:"ids"`
	Error                string          `json:"error"` // the reference failed to render
}

// lockEntry is one line of tokenizers.lock.
type lockEntry struct{ name, version, integrity string }

func readLock(t *testing.T) []lockEntry {
	t.Helper()
	f, err := os.Open("tokenizers.lock")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []lockEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("tokenizers.lock: bad line %q", line)
		}
		out = append(out, lockEntry{fields[0], fields[1], fields[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func readVectors(t *testing.T, name string) *vectorFile {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.NewDecoder(zr).Decode(&v); err != nil {
		t.Fatalf("testdata/%s.json.gz: %v", name, err)
	}
	return &v
}

// filesDir returns LLMGW_TOKENIZER_FILES, or skips the test (fails it
// under CI) when it is unset.
func filesDir(t *testing.T) string {
	dir := os.Getenv("LLMGW_TOKENIZER_FILES")
	if dir != "" {
		return dir
	}
	const how = "fetch them with internal/testutil/tokconformance/fetch-tokenizers.sh " +
		"and run with LLMGW_TOKENIZER_FILES=<repo>/.cache/tokenizers (./xcaddy.sh test does both)"
	testdep.Dep{What: "the real tokenizer files", Hint: how}.Require(t, errors.New("LLMGW_TOKENIZER_FILES is not set"))
	return ""
}

// mismatch is one vector the package under test disagrees on.
type mismatch struct {
	section string // "text", "text+special", "chat render", "chat ids"
	index   int
	kind    string
	input   string // the text, or the reference's rendered chat
	detail  string
}

func (m mismatch) String() string {
	return fmt.Sprintf("%s #%d (%s) %s\n\tinput %s", m.section, m.index, m.kind, m.detail, quoteShort(m.input, 300))
}

func quoteShort(s string, n int) string {
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:n], len(s))
}

// idsDiff describes where got departs from want, or returns "".
func idsDiff(want, got []int) string {
	if slices.Equal(want, got) {
		return ""
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	lo := max(0, i-3)
	return fmt.Sprintf("ids differ at %d (want %d ids, got %d): want %v, got %v",
		i, len(want), len(got), want[lo:min(len(want), i+5)], got[lo:min(len(got), i+5)])
}

// textDiff describes where got departs from want, or returns "".
func textDiff(want, got string) string {
	if want == got {
		return ""
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	lo := max(0, i-40)
	return fmt.Sprintf("rendered text differs at byte %d (want %d bytes, got %d): want %q, got %q",
		i, len(want), len(got), want[lo:min(len(want), i+60)], got[lo:min(len(got), i+60)])
}

func TestVectorsMatchLock(t *testing.T) {
	lock := readLock(t)
	files, err := filepath.Glob(filepath.Join("testdata", "*.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(lock) {
		t.Errorf("testdata has %d vector files, tokenizers.lock pins %d models", len(files), len(lock))
	}
	for _, e := range lock {
		v := readVectors(t, e.name)
		if v.Format != 1 || v.Name != e.name {
			t.Errorf("%s: format %d, name %q", e.name, v.Format, v.Name)
		}
		if v.Source.Version != e.version || v.Source.Integrity != e.integrity {
			t.Errorf("%s: vectors made from %s@%s %s, tokenizers.lock pins %s %s: regenerate them (see doc.go)",
				e.name, v.Source.Package, v.Source.Version, v.Source.Integrity, e.version, e.integrity)
		}
		if len(v.Texts) < 500 {
			t.Errorf("%s: %d texts, want at least 500", e.name, len(v.Texts))
		}
		if v.ChatTemplate.Present && len(v.Chats) < 100 {
			t.Errorf("%s: %d chats, want at least 100", e.name, len(v.Chats))
		}
	}
}

func TestConformance(t *testing.T) {
	dir := filesDir(t)
	for _, e := range readLock(t) {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			checkModel(t, e, filepath.Join(dir, e.name))
		})
	}
}

func checkModel(t *testing.T, e lockEntry, dir string) {
	v := readVectors(t, e.name)
	t.Logf("%s: %d texts, %d chats; reference %v", e.name, len(v.Texts), len(v.Chats), v.Reference)
	// The files must be the pinned ones, or every id may differ for a
	// reason that has nothing to do with the code.
	stamp, err := os.ReadFile(filepath.Join(dir, ".verified"))
	if err != nil {
		t.Fatalf("%v: fetch the files with internal/testutil/tokconformance/fetch-tokenizers.sh", err)
	}
	if first, _, _ := strings.Cut(string(stamp), "\n"); first != e.integrity {
		t.Fatalf("%s holds %s, tokenizers.lock pins %s: fetch again", dir, first, e.integrity)
	}

	start := time.Now()
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded tokenizer.json in %v", time.Since(start).Round(time.Millisecond))

	var mm []mismatch
	total := 0
	for i, tv := range v.Texts {
		total++
		if d := idsDiff(tv.IDs, tok.Encode(tv.Text, false)); d != "" {
			mm = append(mm, mismatch{"text", i, tv.Kind, tv.Text, d})
		}
		if tv.IDsWithSpecial != nil {
			total++
			if d := idsDiff(tv.IDsWithSpecial, tok.Encode(tv.Text, true)); d != "" {
				mm = append(mm, mismatch{"text+special", i, tv.Kind, tv.Text, d})
			}
		}
	}
	if v.ChatTemplate.Present {
		mm = append(mm, checkChats(t, v, dir, tok, &total)...)
	} else {
		t.Logf("no chat vectors: %s", v.ChatTemplate.Note)
	}
	judge(t, e.name, total, mm)
}

func checkChats(t *testing.T, v *vectorFile, dir string, tok *tokenizer.Tokenizer, total *int) []mismatch {
	cfg, err := chattemplate.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The special tokens the reference gave the template must be the ones
	// LoadDir reads; Render below uses LoadDir's.
	for k, want := range v.Special {
		if got := cfg.Special[k]; got != want {
			t.Errorf("chattemplate.LoadDir special token %s = %q, the reference used %q", k, got, want)
		}
	}
	now, err := time.Parse(time.RFC3339, v.Now)
	if err != nil {
		t.Fatal(err)
	}
	var mm []mismatch
	for i, cv := range v.Chats {
		in := chattemplate.Input{
			AddGenerationPrompt:  cv.AddGenerationPrompt,
			ContinueFinalMessage: cv.ContinueFinalMessage,
			Kwargs:               cv.Kwargs,
			Now:                  func() time.Time { return now },
		}
		msgs, err := chattemplate.DecodeJSON(cv.Messages)
		if err != nil {
			t.Fatalf("chat %d messages: %v", i, err)
		}
		in.Messages = msgs.([]any)
		if string(cv.Tools) != "null" {
			tools, err := chattemplate.DecodeJSON(cv.Tools)
			if err != nil {
				t.Fatalf("chat %d tools: %v", i, err)
			}
			in.Tools = tools.([]any)
		}
		*total++
		got, err := cfg.Render(in)
		switch {
		case cv.Error != "":
			if err == nil {
				mm = append(mm, mismatch{"chat render", i, cv.Kind, string(cv.Messages),
					fmt.Sprintf("the reference failed (%s), Render gave %s", cv.Error, quoteShort(got, 200))})
			}
			continue
		case err != nil:
			mm = append(mm, mismatch{"chat render", i, cv.Kind, cv.Text, fmt.Sprintf("Render failed: %v", err)})
		default:
			if d := textDiff(cv.Text, got); d != "" {
				mm = append(mm, mismatch{"chat render", i, cv.Kind, cv.Text, d})
			}
		}
		// The reference's own text, so a template difference does not
		// show up as an id difference too.
		*total++
		if d := idsDiff(cv.IDs, tok.Encode(cv.Text, false)); d != "" {
			mm = append(mm, mismatch{"chat ids", i, cv.Kind, cv.Text, d})
		}
	}
	return mm
}

// judge fails on any mismatch of an exact model; for the others it logs
// the match rate and holds every mismatch to the exceptions table, and
// every exception of the model to a mismatch.
func judge(t *testing.T, name string, total int, mm []mismatch) {
	t.Logf("%s: %d of %d vectors match (%.2f%%)", name, total-len(mm), total, 100*float64(total-len(mm))/float64(total))
	listed := map[exceptionKey]exception{}
	for _, ex := range exceptions {
		if ex.model == name {
			listed[exceptionKey{ex.section, ex.index}] = ex
		}
	}
	reported := map[string]int{}
	report := func(m mismatch, why string) {
		reported[m.section]++
		if n := reported[m.section]; n <= maxReported {
			t.Errorf("%s%s", why, m)
		} else if n == maxReported+1 {
			t.Errorf("... more %s mismatches (the total is below)", m.section)
		}
	}
	unexpected := 0
	for _, m := range mm {
		ex, ok := listed[exceptionKey{m.section, m.index}]
		if exact[name] && !ok {
			report(m, "")
			continue
		}
		if !ok {
			unexpected++
			report(m, "not in the exceptions table: ")
			continue
		}
		delete(listed, exceptionKey{m.section, m.index})
		if !strings.HasPrefix(m.input, ex.text) {
			t.Errorf("exception %s #%d names %q, but the vector is %s: the vectors changed, redo the table",
				ex.section, ex.index, ex.text, quoteShort(m.input, 80))
		}
	}
	for _, ex := range listed {
		t.Errorf("exception %s %s #%d (%q) matches now: remove it from exceptions_test.go", name, ex.section, ex.index, ex.text)
	}
	if len(mm) > len(exceptionsOf(name)) && exact[name] || unexpected > 0 {
		t.Errorf("%s: %d mismatches in all", name, len(mm))
	}
}

// exceptionsOf counts the exceptions listed for a model.
func exceptionsOf(model string) []exception {
	var out []exception
	for _, ex := range exceptions {
		if ex.model == model {
			out = append(out, ex)
		}
	}
	return out
}

func TestExceptionsTable(t *testing.T) {
	seen := map[string]bool{}
	for _, ex := range exceptions {
		if exact[ex.model] && !(ex.referenceBug && ex.section == "chat render") {
			t.Errorf("exception for %s, which must match exactly: fix the code instead (only a chat render where the reference is wrong against Jinja2 may be listed)", ex.model)
		}
		if ex.reason == "" || ex.text == "" {
			t.Errorf("exception %s %s #%d needs its text and a reason", ex.model, ex.section, ex.index)
		}
		switch ex.section {
		case "text", "text+special", "chat render", "chat ids":
		default:
			t.Errorf("exception %s #%d: unknown section %q", ex.model, ex.index, ex.section)
		}
		k := fmt.Sprintf("%s %s %d", ex.model, ex.section, ex.index)
		if seen[k] {
			t.Errorf("exception %s listed twice", k)
		}
		seen[k] = true
	}
}
