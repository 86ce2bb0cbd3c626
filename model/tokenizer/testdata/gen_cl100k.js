// Writes cl100k_base.bin.gz (tiktoken's cl100k_base ranks) and
// cl100k_expected.json (the ids tiktoken gives for the test texts), from
// which bpe_test.go checks byte-level BPE. Run it with the tiktoken npm
// package (the Rust tiktoken compiled to WebAssembly) installed outside the
// repository:
//
//	mkdir /tmp/tk && cd /tmp/tk && npm install tiktoken@1.0.22
//	NODE_PATH=/tmp/tk/node_modules node gen_cl100k.js
//
// cl100k_base.bin holds, per rank from 0, a byte with the token's length
// and its bytes.
const fs = require("fs");
const zlib = require("zlib");
const path = require("path");
const { Tiktoken, get_encoding } = require("tiktoken");
const cl = require("tiktoken/encoders/cl100k_base.json");

const ranks = [];
for (const line of cl.bpe_ranks.split("\n")) {
  if (!line) continue;
  const parts = line.split(" ");
  let r = parseInt(parts[1]);
  for (const b of parts.slice(2)) ranks[r++] = Buffer.from(b, "base64");
}
const bin = [];
for (const b of ranks) bin.push(Buffer.from([b.length]), b);
fs.writeFileSync(path.join(__dirname, "cl100k_base.bin.gz"), zlib.gzipSync(Buffer.concat(bin), { level: 9 }));

// The same ranks with other split expressions, as tiktoken.Tiktoken takes
// them; "whole" does not split at all, to encode words split here.
const bfe = ranks.map((b, r) => b.toString("base64") + " " + r).join("\n");
const WS = "\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"; // Unicode White_Space
const gpt2Pat = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const qwen2Pat = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const enc = get_encoding("cl100k_base");
const gpt2 = new Tiktoken(bfe, {}, gpt2Pat);
const qwen2 = new Tiktoken(bfe, {}, qwen2Pat);
const whole = new Tiktoken(bfe, {}, "(?s:.)+");

// split applies a regular expression as llama.cpp does: matches and the
// stretches between them are words.
function split(words, re) {
  const out = [];
  for (const w of words) {
    let prev = 0;
    for (const m of w.matchAll(re)) {
      if (m.index > prev) out.push(w.slice(prev, m.index));
      if (m[0].length > 0) out.push(m[0]);
      prev = m.index + m[0].length;
    }
    if (prev < w.length) out.push(w.slice(prev));
  }
  return out;
}
function bpeWords(words) {
  const ids = [];
  for (const w of words) ids.push(...whole.encode_ordinary(w));
  return ids;
}
// JavaScript's \s is not White_Space (it has U+FEFF, lacks U+0085): spell it.
const gpt2Split = new RegExp("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + WS + "\\p{L}\\p{N}]+|[" + WS + "]+(?![^" + WS + "])|[" + WS + "]+", "gu");
function smollm(text) { return bpeWords(split(split([text], /\p{N}/gu), gpt2Split)); }
function deflt(text) {
  let w = split([text], /[\p{P}$+<=>^~|]+/gu);
  w = split(w, gpt2Split);
  w = split(w, /\p{N}+/gu);
  w = split(w, /[0-9][0-9][0-9]/g);
  return bpeWords(w);
}

const texts = [
  "",
  "Hello world",
  "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.\n\nHowever little known the feelings or views of such a man may be on his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of some one or other of their daughters.",
  "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that Netherfield Park is let at last?\"",
  "func (t *Tokenizer) Encode(text string, bos bool) []int {\n\tif text == \"\" {\n\t\treturn nil // nothing\n\t}\n\tfor i := 0; i < len(text); i++ {\n\t\tids = append(ids, int(text[i])&0xff)\n\t}\n}\n",
  "def f(x, *args, **kw):\n    \"\"\"Docstring.\"\"\"\n    if x != 0 and x >= -1:\n        return {'a': [1, 2, 3], \"b\": (x ** 2) // 3}\n    # comment\n    return lambda y: y@x\n",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);return 0;}\n/* block */ x+=y<<2; a->b; c::d; e?.f ?? g;",
  "<div class=\"x\">&nbsp;<a href='https://example.com/path?q=1&r=2#frag'>link</a></div>",
  "In 1999, 1234567 people paid $3.14 each; 0.000123, 12,345,678, 1e-10, 2^64=18446744073709551616, phone 555-0100.",
  "Arabic-Indic ١٢٣٤٥٦٧, fullwidth １２３４５, superscript x² and ½ and Ⅻ, Devanagari २०२४.",
  "a  b   c\t\td \n\n\n  e\r\n\r\nf   \n   g    ",
  "   leading and trailing   ",
  "     ",
  "\n",
  "\n\n\n\n",
  " \n \n x",
  "\t\t\tindented\n\t\t\t\tmore\n",
  "x\u00a0\u00a0y\u3000z\u2003w \u2009v\u0085u\u000bt\u000cs\ufeffr",
  "我们今天去公园散步，然后吃午饭。东京は日本の首都です。カタカナ、ひらがな。",
  "안녕하세요 세계! 반갑습니다.",
  "Привет, мир! Как дела? Ёжик в тумане.",
  "Καλημέρα κόσμε· ΑΒΓ αβγ.",
  "مرحبا بالعالم، كيف حالك؟",
  "שלום עולם",
  "नमस्ते दुनिया, क्या हाल है?",
  "สวัสดีชาวโลก",
  "emoji 👋🌍 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ✔️ ❤️",
  "combining e\u0301 n\u0303 a\u0308\u0304 and precomposed é ñ",
  "I'm sure you'll see they've done it; she'd say it's John's. We're here.",
  "I'M SURE YOU'LL SEE THEY'VE DONE IT; SHE'D SAY IT'S JOHN'S. WE'RE.",
  "It'S 'ſ x'ſa ''s ' s 'x 'll' 've're",
  "abc123def456 x1y22z333 l33t h4x0r 3.14159265358979 10000000000",
  "## Title\n\n- item *bold* `code` [link](url)\n> quote\n\n```go\nx := 1\n```\n",
  "!!!???...,,,;;;::: --- ___ *** /// \\\\\\ ||| $$$ +++ === ^^^ ~~~ <<< >>>",
  "a!\n\nb?\r\n c.  \n\n d",
];
const specialTexts = [
  "<|endoftext|>",
  "Hello<|endoftext|>world<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>  return 1<|endofprompt|>",
  " <|endoftext|> <|endoftext|><|endoftext|>x",
  "<|endoftext<|endoftext|>|>",
];

// Random texts of tricky pieces, from a fixed seed.
let seed = 20240611;
function rnd(n) {
  seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return (((t ^ (t >>> 14)) >>> 0) % n);
}
const atoms = ["a", "b", "Z", "the", "The", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "'", "'s", "'S", "'ll", "'LL", "'ve", "'re", "'d", "'m", "'t", "ſ",
  "0", "1", "12", "345", "6789", ".", ",", "!", "?", "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "$", "+", "=", "^", "~", "`", "@", "#", "%", "&", "*", "\"", ";", ":",
  "\u00a0", "\u3000", "\u2003", "\u0085", "\u000b", "\ufeff", "é", "ü", "ß", "Ω", "λ", "ж", "Я", "中", "文", "字", "한", "글", "ع", "ب", "न", "\u093f", "\u0301", "😀", "👍🏽", "\u200d", "٣", "²", "Ⅻ", "½", "<|endoftext|>"];
for (let i = 0; i < 300; i++) {
  let s = "";
  const n = rnd(40);
  for (let k = 0; k < n; k++) s += atoms[rnd(atoms.length)];
  texts.push(s);
}

const cases = [];
for (const text of texts) {
  cases.push({
    text,
    cl100k: Array.from(enc.encode_ordinary(text)),
    gpt2: Array.from(gpt2.encode_ordinary(text)),
    qwen2: Array.from(qwen2.encode_ordinary(text)),
    smollm: smollm(text),
    default: deflt(text),
  });
}
for (const text of specialTexts) {
  cases.push({ text, cl100k: Array.from(enc.encode_ordinary(text)), special: Array.from(enc.encode(text, "all")) });
}
fs.writeFileSync(path.join(__dirname, "cl100k_expected.json"), JSON.stringify(cases) + "\n");
