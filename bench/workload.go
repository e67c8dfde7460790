package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/llmgw/caddy-llmgw/internal/sim/simwords"
)

// A workload is a list of sessions. A session is a conversation of one or
// more turns sent one after the other; single-request workloads (the
// shared-prefix family, the random control) are one-turn sessions. The
// load generator starts sessions at the arrival rate and runs each
// session's turns in order, so a multi-turn session's later requests carry
// the earlier answers in their history, exactly as a chat client does.

// Session is one conversation.
type Session struct {
	// Key identifies the session's cache-affinity group: the shared-prefix
	// group, or the chat session. It is sent in the cache-key header.
	Key string
	// System is the system prompt ("" for none). Sessions of one group
	// share the same string.
	System string
	// Model is the "model" of the session's requests; "" = the target's.
	Model string
	Turns []Turn
	// Think is the pause between a turn's answer and the next turn, in
	// simulated seconds.
	Think float64
}

// Turn is one user message and the answer length asked for.
type Turn struct {
	User      string
	MaxTokens int
	// Image, when set, is an image part sent before User in the turn's
	// message (an "images" workload).
	Image *ImageRef
}

// WorkloadSpec describes a workload by parameters; Build generates its
// text. Token counts are for the simulator's tokenizer, which splits text
// into words (each with its leading space) and punctuation: one generated
// word is one token.
type WorkloadSpec struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // "prefix", "burst", "multiturn", "random" or "images"
	// Shared-prefix family: Groups × PerGroup requests; each request is
	// the group's system prompt (SystemTokens) plus its own question
	// (QuestionTokens), answered with OutputTokens.
	Groups         int `json:"groups"`
	PerGroup       int `json:"per_group"`
	SystemTokens   int `json:"system_tokens"`
	QuestionTokens int `json:"question_tokens"`
	OutputTokens   int `json:"output_tokens"`
	// Multi-turn: Groups sessions of Turns turns each; every session has
	// its own system prompt; ThinkSeconds between turns.
	Turns        int     `json:"turns,omitempty"`
	ThinkSeconds float64 `json:"think_seconds,omitempty"`
	// Reference is the field's original shape this workload was scaled
	// from, for the report ("256×16, 2048/256/256").
	Reference string `json:"reference,omitempty"`
	Seed      uint64 `json:"seed"`
	// Models, when set, gives the prefix family's groups their models: the
	// first Models[0].Groups groups ask for Models[0].Model, and so on
	// (the counts add up to Groups). Unset: every request asks for the
	// target's model.
	Models []ModelGroups `json:"models,omitempty"`
	// Images family (images.go): Groups distinct images, PerGroup
	// requests each; every request is one system prompt shared by all
	// (SystemTokens), then a user message of the group's image, which the
	// engines expand to ImageTokens placeholder tokens, and a question of
	// its own (QuestionTokens). Every UUIDEvery-th image (the first, the
	// UUIDEvery+1-th, ...) is sent with a uuid; 0: none is.
	ImageTokens int `json:"image_tokens,omitempty"`
	UUIDEvery   int `json:"uuid_every,omitempty"`
}

// ModelGroups is how many of a workload's groups ask for a model.
type ModelGroups struct {
	Model  string `json:"model"`
	Groups int    `json:"groups"`
}

// groupModels is the model of each of the workload's groups, or nil when
// the workload names none.
func (w WorkloadSpec) groupModels() ([]string, error) {
	if len(w.Models) == 0 {
		return nil, nil
	}
	if w.Kind != "prefix" && w.Kind != "burst" {
		return nil, fmt.Errorf("workload %s: models are for the prefix family, not %q", w.Name, w.Kind)
	}
	var out []string
	for _, m := range w.Models {
		if m.Model == "" || m.Groups <= 0 {
			return nil, fmt.Errorf("workload %s: model %q with %d groups", w.Name, m.Model, m.Groups)
		}
		for range m.Groups {
			out = append(out, m.Model)
		}
	}
	if len(out) != w.Groups {
		return nil, fmt.Errorf("workload %s: models cover %d groups of %d", w.Name, len(out), w.Groups)
	}
	return out, nil
}

// Requests is the number of requests the workload sends.
func (w WorkloadSpec) Requests() int {
	if w.Kind == "multiturn" {
		return w.Groups * w.Turns
	}
	return w.Groups * w.PerGroup
}

// PromptTokens is the largest prompt of the workload, in tokens (the last
// turn of a session for multi-turn), without the chat template's few
// tokens.
func (w WorkloadSpec) PromptTokens() int {
	if w.Kind == "multiturn" {
		return w.SystemTokens + w.Turns*(w.QuestionTokens+w.OutputTokens)
	}
	return w.SystemTokens + w.ImageTokens + w.QuestionTokens
}

// SharedTokens is the part of the prompts that is shared (and so worth
// caching): per group for the prefix family, per session for multi-turn.
func (w WorkloadSpec) SharedTokens() int {
	switch w.Kind {
	case "multiturn":
		return w.PromptTokens()
	case "random":
		return 0
	case "images":
		return w.SystemTokens + w.ImageTokens
	}
	return w.SystemTokens
}

// Shape is the workload's shape for tables.
func (w WorkloadSpec) Shape() string {
	switch w.Kind {
	case "multiturn":
		return fmt.Sprintf("%d sessions × %d turns, %d/%d/%d", w.Groups, w.Turns, w.SystemTokens, w.QuestionTokens, w.OutputTokens)
	case "random":
		return fmt.Sprintf("%d unique prompts, %d/%d", w.Groups*w.PerGroup, w.QuestionTokens, w.OutputTokens)
	}
	if w.Kind == "images" {
		return fmt.Sprintf("%d images × %d, %d/%d image/%d/%d", w.Groups, w.PerGroup, w.SystemTokens, w.ImageTokens, w.QuestionTokens, w.OutputTokens)
	}
	if w.Kind == "burst" {
		return fmt.Sprintf("%d bursts × %d, %d/%d/%d", w.Groups, w.PerGroup, w.SystemTokens, w.QuestionTokens, w.OutputTokens)
	}
	return fmt.Sprintf("%d×%d, %d/%d/%d", w.Groups, w.PerGroup, w.SystemTokens, w.QuestionTokens, w.OutputTokens)
}

// groupModel is group g's model, "" when the workload names none.
func groupModel(models []string, g int) string {
	if models == nil {
		return ""
	}
	return models[g]
}

// Build generates the workload's sessions in the order they are sent,
// asking for OutputTokens/tokenScale tokens per answer (see
// EngineModel.TokenScale). The same spec always yields the same text.
func (w WorkloadSpec) Build(tokenScale int) ([]Session, error) {
	if w.Groups <= 0 || w.QuestionTokens <= 0 || w.OutputTokens <= 0 {
		return nil, fmt.Errorf("workload %s: groups, question and output tokens must be positive", w.Name)
	}
	rng := rand.New(rand.NewPCG(w.Seed, 0x6c6c6d6777))
	out := max(1, (w.OutputTokens+tokenScale-1)/max(1, tokenScale))
	models, err := w.groupModels()
	if err != nil {
		return nil, err
	}
	var sessions []Session
	switch w.Kind {
	case "prefix", "burst":
		if w.PerGroup <= 0 || w.SystemTokens <= 0 {
			return nil, fmt.Errorf("workload %s: per_group and system tokens must be positive", w.Name)
		}
		systems := make([]string, w.Groups)
		for g := range systems {
			systems[g] = simwords.Words(rng, fmt.Sprintf("group%d", g), w.SystemTokens)
		}
		for g := 0; g < w.Groups; g++ {
			for i := 0; i < w.PerGroup; i++ {
				sessions = append(sessions, Session{
					Key:    fmt.Sprintf("group-%d", g),
					System: systems[g],
					Model:  groupModel(models, g),
					Turns:  []Turn{{User: simwords.Words(rng, fmt.Sprintf("q%d", i), w.QuestionTokens), MaxTokens: out}},
				})
			}
		}
		// Interleave the groups, as clients of many tenants would; a
		// burst workload keeps each group's requests together, to be
		// sent as one burst (LoadConfig.BurstSize).
		if w.Kind == "burst" {
			break
		}
		rng.Shuffle(len(sessions), func(i, j int) { sessions[i], sessions[j] = sessions[j], sessions[i] })
	case "multiturn":
		if w.Turns <= 0 {
			return nil, fmt.Errorf("workload %s: turns must be positive", w.Name)
		}
		for s := 0; s < w.Groups; s++ {
			sess := Session{Key: fmt.Sprintf("session-%d", s), Think: w.ThinkSeconds}
			if w.SystemTokens > 0 {
				sess.System = simwords.Words(rng, fmt.Sprintf("session%d", s), w.SystemTokens)
			}
			for t := 0; t < w.Turns; t++ {
				sess.Turns = append(sess.Turns, Turn{User: simwords.Words(rng, fmt.Sprintf("turn%d", t), w.QuestionTokens), MaxTokens: out})
			}
			sessions = append(sessions, sess)
		}
	case "images":
		return w.buildImages(rng, out)
	case "random":
		n := w.Groups * max(w.PerGroup, 1)
		for i := 0; i < n; i++ {
			sessions = append(sessions, Session{
				Key:   fmt.Sprintf("req-%d", i),
				Turns: []Turn{{User: simwords.Words(rng, fmt.Sprintf("unique%d", i), w.QuestionTokens), MaxTokens: out}},
			})
		}
	default:
		return nil, fmt.Errorf("workload %s: unknown kind %q", w.Name, w.Kind)
	}
	return sessions, nil
}
