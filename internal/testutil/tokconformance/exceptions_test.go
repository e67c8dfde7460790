package tokconformance

// exception is a gemma3 or llama2 vector on which the gateway may differ
// from the reference, for a reason checked and written down. Each must
// still differ: one that matches again fails the test, so the table stays
// honest. Exact models (qwen3, llama3_1, deepseek_v3, gptoss) may have
// none.
type exception struct {
	model   string
	section string // "text", "text+special", "chat render", "chat ids"
	index   int    // the vector's index in its file's texts or chats
	text    string // the start of the vector's text (for a chat, of the reference's rendered text)
	reason  string
	// referenceBug marks a chat render where the JS reference is wrong
	// against Python's Jinja2, which vLLM renders with: the one kind of
	// exception an exact model may have (gen/jinja2_check.py shows it).
	referenceBug bool
}

type exceptionKey struct {
	section string
	index   int
}

// lstripBug is the reason of qwen3's reference bugs.
const lstripBug = "qwen3's template calls .lstrip('\\n') on a message that starts with spaces: @huggingface/jinja 0.5.11 ignores str.lstrip's argument and strips all white space; " +
	"Python's str.lstrip('\\n') (Jinja2, what vLLM runs) keeps the spaces, and so does chattemplate"

var exceptions = []exception{
	{
		model: "qwen3", section: "chat render", index: 0, referenceBug: true,
		text:   "<|im_start|>system\nYou are a coding assi",
		reason: lstripBug,
	},
	{
		model: "qwen3", section: "chat render", index: 1, referenceBug: true,
		text:   "<|im_start|>system\nYou are a coding assi",
		reason: lstripBug,
	},
	{
		model: "qwen3", section: "chat render", index: 24, referenceBug: true,
		text:   "<|im_start|>system\nYou are Qwen, created",
		reason: lstripBug,
	},
	{
		model: "qwen3", section: "chat render", index: 83, referenceBug: true,
		text:   "<|im_start|>system\n  System prompt with ",
		reason: lstripBug,
	},
	{
		model: "qwen3", section: "chat render", index: 86, referenceBug: true,
		text:   "<|im_start|>system\nYou are Qwen, created",
		reason: lstripBug,
	},
	{
		model: "qwen3", section: "chat render", index: 104, referenceBug: true,
		text:   "<|im_start|>system\nFollow these rules:\n1",
		reason: lstripBug,
	},
	{
		model: "llama3_1", section: "chat render", index: 14, referenceBug: true,
		text:   "<|begin_of_text|><|start_header_id|>user",
		reason: "the user turn starts with U+FEFF and the template trims it: @huggingface/jinja's trim strips U+FEFF (JS String.trim), Python's str.strip keeps it (Jinja2, what vLLM runs), and so does chattemplate",
	},
	{
		model: "gemma3", section: "chat render", index: 25,
		text: "<bos><start_of_turn>user\n你是一个乐于助人的助手。",
		reason: "the user turn starts with U+FEFF and the template trims it: @huggingface/jinja's trim is JS String.trim, which strips U+FEFF; " +
			"Python's str.strip (Jinja2's trim, what vLLM runs) keeps it, and so does chattemplate. The reference is wrong here " +
			"(gen/jinja2_check.py shows Jinja2 3.1.6 keeping it); llama3_1 chat 14 is the same case and, llama3_1 being exact, fails",
	},
}
