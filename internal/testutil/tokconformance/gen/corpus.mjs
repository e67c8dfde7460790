// The text corpus of the conformance vectors: fragments by kind, the fixed
// edge cases, and the seeded mixtures gen.mjs draws from them. Everything here
// is valid UTF-8 (no lone surrogates): the Go side gets the same string.

export const prose = [
  "The quick brown fox jumps over the lazy dog.",
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
  "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, I thought I would sail about a little.",
  "In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move.",
  "Dr. Smith's lab (Room 4B) reported a 12.5% increase in yield; see Fig. 3, p. 217.",
  "\"Hello,\" she said. \"Are you coming?\" He didn't answer — he'd already left.",
  "Prices rose from $3.99 to $4.49 (≈12.5%) between Q1 and Q3 of FY2024.",
  "Please reply by 5 p.m. on Friday, 14 March; e-mail: jane.doe@example.com, tel. +1 (555) 010-9999.",
  "Well... I suppose so!? Maybe?! No -- definitely not; absolutely—not.",
  "The U.S.A., the U.K., and the E.U. signed the accord at 09:30 UTC.",
  "Café déjà vu: naïve coöperation at the façade of the Übermensch's résumé.",
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
  "What's the difference between a gateway and a proxy? A gateway understands the protocol it's speaking.",
  "Summarise the following article in three bullet points, then list any open questions.",
  "  Leading spaces, and trailing ones too.   ",
  "ALL CAPS SENTENCE WITH NUMBERS 42 AND SYMBOLS #@!",
  "camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE_CASE",
  "https://example.com/path/to/page?query=value&other=1#fragment",
  "C:\\Users\\Admin\\Documents\\report_final_v2.docx",
  "¿Dónde está la biblioteca? ¡Está allí!",
  "Straße, Größe, Maß — ß and ẞ; İstanbul, ıi; Ǆemal; ﬁne ﬂour (ligatures).",
  "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
  "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
];

export const code = [
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i)\n\t}\n}\n",
  "func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {\n\tif r.Method != http.MethodPost {\n\t\thttp.Error(w, \"method not allowed\", 405)\n\t\treturn\n\t}\n}",
  "type Config struct {\n\tName    string `json:\"name\"`\n\tTimeout int    `json:\"timeout,omitempty\"`\n}",
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
  "class Node:\n    def __init__(self, value, children=None):\n        self.value = value\n        self.children = children or []\n\n    def __repr__(self):\n        return f\"Node({self.value!r})\"\n",
  "import numpy as np\nx = np.linspace(0, 2 * np.pi, 100)\ny = np.sin(x) ** 2 + np.cos(x) ** 2\nassert np.allclose(y, 1.0)",
  "{\"model\": \"qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true, \"max_tokens\": 256}",
  "{\n  \"name\": \"caddy-llmgw\",\n  \"version\": \"1.0.0\",\n  \"tags\": [\"llm\", \"gateway\"],\n  \"nested\": {\"a\": null, \"b\": false, \"c\": 1.5e-10}\n}",
  "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; page</title></head>\n<body>\n  <div class=\"container\" id=\"main\">\n    <p>Hello, <b>world</b>!</p>\n  </div>\n</body>\n</html>",
  "<script>const x = a => a?.b ?? 0; document.querySelector('#id').innerHTML = `<span>${x}</span>`;</script>",
  "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 5;",
  "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f: $(wc -l < \"$f\")\"\ndone",
  "fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
  "if (a !== b && c >= d || e <= f) { x += 1; y -= 2; z *= 3; w /= 4; } // comment",
  "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*)$",
  "    indented with four spaces\n        and eight\n\t\tand two tabs\n  \t mixed",
];

export const cjk = [
  "你好，世界！今天天气很好，我们去公园散步吧。",
  "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
  "北京市海淀区中关村大街１号，邮编100080。",
  "日本語のテキスト：今日は良い天気ですね。カタカナとひらがなと漢字。",
  "東京タワーは高さ３３３メートルです。ｶﾀｶﾅ（半角）もあります。",
  "한국어 텍스트입니다. 오늘 날씨가 정말 좋네요! 안녕하세요.",
  "대한민국의 수도는 서울특별시이다. 인구는 약 950만 명이다.",
  "中文、日本語、한국어が混在する文章。Mixed with English words.",
  "「引用符」『二重引用符』【括弧】〈山括弧〉《二重山括弧》",
  "繁體中文：臺灣的資訊科技產業非常發達。",
];

export const rtl = [
  "مرحبا بالعالم! هذا نص تجريبي باللغة العربية.",
  "مُحَمَّدٌ رَسُولُ اللَّهِ — نص مع التشكيل الكامل.",
  "العدد ١٢٣٤٥٦ مكتوب بالأرقام العربية الهندية.",
  "שלום עולם! זהו טקסט בעברית.",
  "שָׁלוֹם עֲלֵיכֶם — עם ניקוד.",
  "Mixed RTL: the word עברית and العربية inside English.",
  "\u200Fرسالة مع علامة من اليمين إلى اليسار\u200F and \u202Eoverride\u202C text.",
  "فارسی: سلام دنیا، این یک آزمایش است.",
];

export const indic = [
  "नमस्ते दुनिया! यह एक परीक्षण वाक्य है।",
  "हिन्दी में संख्याएँ: १२३४५६७८९०",
  "क्षत्रिय, ज्ञान, श्री, द्वार — संयुक्ताक्षर।",
  "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
  "กรุงเทพมหานคร อมรรัตนโกสินทร์ มหินทรายุธยา",
  "வணக்கம் உலகம்! இது ஒரு சோதனை.",
  "বাংলা ভাষা একটি ইন্দো-আর্য ভাষা।",
  "ဗမာစာ မြန်မာဘာသာ",
  "ქართული ენა — Georgian; Հայերեն — Armenian; አማርኛ — Amharic.",
];

export const emoji = [
  "👍", "👍🏻👍🏼👍🏽👍🏾👍🏿",
  "👨‍👩‍👧‍👦 family", "👩‍💻👨🏽‍🚀🧑🏿‍🔬",
  "🏳️‍🌈🏳️‍⚧️🏴‍☠️",
  "🇯🇵🇺🇸🇩🇪🇫🇷🇧🇷🇮🇳",
  "🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁥󠁮󠁧󠁿 (tag sequences)",
  "❤️ ❤ ♥️ ☺️ ✌🏿 1️⃣ #️⃣ *️⃣",
  "I love pizza 🍕🍕🍕 and 🍣!!!",
  "🫠🫡🥹🪿🧌 newer emoji",
  "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇",
  "👁️‍🗨️ 🧔‍♀️ 👩‍❤️‍💋‍👨 🫱🏼‍🫲🏿",
];

// Text that NFC changes (decomposed letters, singletons, Hangul jamo), and
// combining marks that stay.
export const combining = [
  "e\u0301 vs \u00e9; A\u030a vs \u00c5 vs \u212b (angstrom sign)",
  "Tie\u0302\u0301ng Vie\u0323\u0302t (NFD) vs Tiếng Việt (NFC)",
  "\u1100\u1161\u11a8 \u1112\u1161\u11ab (Hangul jamo)",
  "\u2126 ohm sign, \u212a kelvin sign, \u0958 devanagari qa",
  "Z\u0335\u0321\u0322\u031b\u0317\u0318\u0319\u031c\u031d\u031e\u031f\u0320\u030a\u030b\u030c\u030d\u030e\u030f\u0310\u0311\u0312\u0313\u0314algo",
  "o\u0308\u0304 a\u0328\u0301 q\u0307\u0323 s\u0323\u0307 (reordered marks)",
  "\u0041\u030a\u0301 \u00c5\u0301 \u01fa",
  "ﬁ ﬀ ﬃ ² ³ ½ ① Ⅻ ｆｕｌｌｗｉｄｔｈ (compatibility, not NFC)",
  "\u0915\u093c \u0929 \u09a1\u09bc",
  "\u05e9\u05c1\u05b8 \u05e9\u05b8\u05c1 (hebrew marks in two orders)",
];

// Valid UTF-8 that tends to trip byte handling: U+FFFD, noncharacters, line
// and paragraph separators, format and control characters.
export const oddities = [
  "replacement \ufffd character \ufffd\ufffd",
  "noncharacters \ufffe \uffff \ufdd0 \ufdef \u{1fffe} \u{10ffff}",
  "line\u2028separator and paragraph\u2029separator",
  "next\u0085line nbsp\u00a0here zwsp\u200bthere zwj\u200dzwnj\u200c",
  "\ufeffBOM at the start, and \ufeff inside",
  "ideographic\u3000space, en\u2002em\u2003thin\u2009hair\u200a",
  "controls \u0000 \u0001 \u0007 \u0008 \u000b \u000c \u001b[31mred\u001b[0m \u007f",
  "private use \ue000 \uf8ff \u{f0000} \u{10fffd}",
  "surrogate neighbours \ud7ff \ue000 \u{10000} \u{1f600}",
  "soft\u00adhyphen and word\u2060joiner and \u180emongolian",
  "math 𝐀𝐁𝐂 𝔸𝔹ℂ 𝒶𝒷𝒸 ∀x∈ℝ: x²≥0 ∑∫∂√∞≠≈",
  "\u{1d11e} musical, \u{13000} hieroglyph, \u{1f0a1} card",
];

export const specialLike = [
  "<|im_start|>user\nhello<|im_end|>",
  "<|im_sta", "<|im_start", "<|im_start|", "|im_start|>", "< |im_start| >", "<|IM_START|>",
  "<s>", "</s>", "<s> hi </s>", "<s><s></s>", "<unk>", "<pad>",
  "<|begin_of_text|>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "<|begin_of_text", "<|eot_id|> <|eot_id|>",
  "<|endoftext|>", "text<|endoftext|>more", "<|endoftext|><|endoftext|>",
  "<bos><start_of_turn>user\nhi<end_of_turn>\n", "<start_of_turn", "<end_of_turn>model",
  "<｜begin▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>", "<｜end▁of▁sentence｜>",
  "<|start|>assistant<|channel|>final<|message|>hi<|end|>", "<|return|>", "<|call|>",
  "[INST] hello [/INST]", "<<SYS>>\nsystem\n<</SYS>>",
  "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "< s >", "<<s>>", "<s", "s>", "<|", "|>", "<||>", "<|>",
];

export const words = [
  "gateway", "tokenizer", "antidisestablishmentarianism", "pneumonoultramicroscopicsilicovolcanoconiosis",
  "the", "of", "and", "internationalization", "Supercalifragilisticexpialidocious",
  "Donaudampfschifffahrtsgesellschaftskapitän", "llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch",
  "hello", "world", "HELLO", "World", "wOrLd", "naïve", "über", "日本", "中文", "한국", "مرحبا", "שלום", "नमस्ते", "ไทย",
];

export const contractions = [
  "I'M HERE", "He'S", "YOU'LL", "we'Ll", "SHE'D", "they'VE", "can'T", "it'S'S", "'s", "''s",
  "Don't you think it's fine? I'll say we're done, they've gone, I'd go, I'm in.",
  "DON'T YOU THINK IT'S FINE? I'LL SAY WE'RE DONE, THEY'VE GONE, I'D GO, I'M IN.",
  "dOn'T yOu'Re We'Ve i'M tHeY'lL sHe'D iT'S",
  "It’s a curly apostrophe — don’t split it like ’s or ’ll.",
  "rock 'n' roll, 'tis, o'clock, ma'am, y'all'd've",
  "the cat's toy's box's lid", "JAMES'S 'S 'T 'RE 'VE 'M 'LL 'D",
  "'ll'll'll", "x's y'S z'lL",
];

const digitSeq = "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679";

// fixedTexts lists the enumerated edge cases: every one is in every
// tokenizer's vectors.
export function fixedTexts() {
  const out = [];
  const add = (kind, text) => out.push({ kind, text });
  for (let n = 1; n <= 40; n++) add("digits", digitSeq.slice(0, n));
  for (const n of [50, 64, 100]) add("digits", digitSeq.slice(0, n));
  for (const s of ["0", "00", "000", "0000", "007", "1,000,000", "1 000 000", "3.14159", "-42", "+1e-10", "0x1F", "2024-06-15", "12:34:56", "v1.2.3", "192.168.0.1",
    "١٢٣٤٥٦", "१२३४५", "１２３４５６", "①②③", "²³¹", "ⅫⅣ", "abc123def456", "A1B22C333D4444"]) add("digits", s);
  for (let n = 1; n <= 16; n++) add("whitespace", "a" + " ".repeat(n) + "b");
  for (const n of [24, 32, 64, 100]) add("whitespace", "x" + " ".repeat(n) + "y");
  for (let n = 1; n <= 6; n++) add("whitespace", " ".repeat(n));
  for (let n = 1; n <= 8; n++) add("whitespace", "a" + "\t".repeat(n) + "b");
  for (let n = 1; n <= 8; n++) add("newlines", "a" + "\n".repeat(n) + "b");
  for (let n = 1; n <= 6; n++) add("newlines", "a" + "\r\n".repeat(n) + "b");
  for (const s of ["\n", "\n\n", "\r\n", "\r", "\r\r\n\n", " \n", "\n ", " \n \n ", "\t\n\t", "a \nb", "a\n b", "a \n\n  b",
    "line one\r\nline two\r\nline three\r\n", "trailing spaces   \nand tabs\t\t\nand both \t \n", "end with newline\n", "end with spaces   ",
    "    ", "\t", " \t \t ", "a  \n\n\n   \t\n b", "x\u00a0\u00a0y", "x \u3000 y"]) add("whitespace", s);
  for (const s of contractions) add("contractions", s);
  for (const s of specialLike) add("special_like", s);
  for (const s of combining) add("nfc", s);
  for (const s of oddities) add("oddities", s);
  for (const s of emoji) add("emoji", s);
  add("long_word", "a".repeat(500));
  add("long_word", "ab".repeat(300));
  add("long_word", "Supercalifragilisticexpialidocious".repeat(12));
  add("long_word", "x".repeat(1) + "y".repeat(255) + "z".repeat(256));
  add("long_word", "QmFzZTY0IGVuY29kZWQgZGF0YSBsb29rcyBsaWtlIHRoaXMgYW5kIGdvZXMgb24gZm9yIGEgd2hpbGUgd2l0aG91dCBzcGFjZXM=".repeat(4));
  add("long_word", "漢".repeat(200));
  add("long_word", "🙂".repeat(100));
  add("long_word", "-".repeat(80) + "\n" + "=".repeat(80));
  add("long_word", "!".repeat(64) + "?".repeat(64));
  add("long_word", "ـــــــــــــــــــــــــــــــــــــــــــــــــــ");
  add("empty", "");
  add("empty", " ");
  return out;
}

const pools = { prose, code, cjk, rtl, indic, emoji, combining, oddities, specialLike, words, contractions };
const weights = [["prose", 5], ["code", 4], ["cjk", 3], ["rtl", 2], ["indic", 2], ["emoji", 2], ["combining", 1], ["oddities", 1], ["specialLike", 2], ["words", 3], ["contractions", 1]];
const seps = [" ", " ", " ", "", "\n", "\n\n", "\t", "  ", "\r\n", " \n", "   ", ". ", ", "];

// mixedText draws a text of 1-4 fragments from the pools, some cut at a
// random code point (never inside a surrogate pair: cuts are on the code
// point array), joined with a random separator, sometimes with trailing
// whitespace or a digit run.
export function mixedText(rng) {
  const total = weights.reduce((s, [, w]) => s + w, 0);
  const pick = () => {
    let r = rng.int(total);
    for (const [k, w] of weights) {
      if ((r -= w) < 0) return k;
    }
    throw new Error("unreachable");
  };
  const n = 1 + rng.int(4);
  const kinds = [];
  let text = "";
  for (let i = 0; i < n; i++) {
    const k = pick();
    kinds.push(k);
    let frag = rng.choice(pools[k]);
    if (rng.int(4) === 0) {
      const cps = [...frag];
      const a = rng.int(cps.length + 1);
      const b = a + rng.int(cps.length - a + 1);
      frag = cps.slice(a, b).join("");
    }
    if (i > 0) text += rng.choice(seps);
    text += frag;
  }
  if (rng.int(6) === 0) text += " ".repeat(1 + rng.int(4));
  if (rng.int(8) === 0) text += digitSeq.slice(0, 1 + rng.int(20));
  if (rng.int(10) === 0) text = "\n".repeat(1 + rng.int(3)) + text;
  return { kind: "mixed:" + [...new Set(kinds)].join("+"), text };
}
