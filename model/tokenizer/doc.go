// Package tokenizer turns text into the ids of a language model's
// vocabulary and back, as llama.cpp does for the two kinds GGUF files
// hold: SentencePiece-style BPE (tokenizer.ggml.model "llama": Llama 1
// and 2, Mistral, TinyLlama, llama2.c) and GPT-2-style byte-level BPE
// ("gpt2": Llama 3, Qwen2, SmolLM, GPT-2).
//
// # SentencePiece
//
// Encode replaces every space with "▁" (U+2581) and, with AddSpacePrefix
// (the default for Llama vocabularies), puts one "▁" in front of a
// non-empty text. The text is split into UTF-8 characters (a byte that is
// not valid UTF-8 is a character of its own). Then, as SentencePiece's
// BPE does, the adjacent pair whose concatenation is a vocabulary piece
// with the highest score is merged, the leftmost on a tie, again and
// again until no adjacent pair forms a piece. A symbol left that is not a
// piece is written as its bytes, with the <0xXX> byte pieces (a "▁" in it
// as the byte of a space), or as the unknown piece where a byte has no
// piece. Only pieces of kind Normal, Undefined and UserDefined are merged into.
//
// A merge can only join characters that sit side by side in some piece,
// so the text is first cut wherever two neighbouring characters are not
// such a pair (in an English vocabulary: before every word) and each part
// is merged alone, with the result of merging the whole, in time linear in
// the text for any vocabulary whose pieces do not run across words.
//
// # Byte-level BPE
//
// NewBPE's tokenizers split the text into words with the pre-tokenizer
// that tokenizer.ggml.pre names: llama-bpe (Llama 3, tiktoken's
// cl100k_base expression; also llama3, llama-v3, falcon3, pixtral, dbrx,
// smaug-bpe), qwen2 (the same with single digits; also deepseek-r1-qwen,
// megrez, stablelm2), smollm (digits alone, then GPT-2's expression; also
// starcoder, refact, command-r, codeshell, exaone, minerva-7b), gpt-2
// (GPT-2's expression; also phi-2, mpt, olmo) and default (llama.cpp's
// sequence for a vocabulary that names none). The expressions use
// look-ahead, which Go's regexp lacks, so each is a scanner of its own
// that follows the expression's semantics exactly (see pretok.go); case
// folding in (?i:'s|...) is Rust's and tiktoken's, under which "ſ" is an
// s, and characters are classed by package unicode, where an invalid
// byte is neither letter, number nor space.
//
// Each word's bytes become characters by GPT-2's bytes_to_unicode (the
// vocabulary's pieces are written in it), and the adjacent pair with the
// lowest-ranked rule of tokenizer.ggml.merges is merged, the leftmost on
// a tie, until no pair has a rule, as llama.cpp does; with llama-bpe a
// word that is itself a piece is taken as it is, as tiktoken and
// llama.cpp's ignore_merges do. A symbol that is no piece falls back to
// the pieces of its bytes.
//
// Both merge loops scan for the best pair on short words and keep a
// priority queue on long ones, so a word costs O(n log n) in its length
// and a text time linear in its length whatever its words.
//
// # Special pieces, BOS and EOS
//
// Before encoding, the text is cut at special pieces, as llama.cpp's
// tokenizer_st_partition does: user-defined pieces always, control and
// unknown ones (<s>, <|eot_id|>) only in Tokenize with parseSpecial, the
// longest first, each occurrence becoming its piece; the text between is
// encoded (with SentencePiece, a "▁" goes in front of each stretch after
// a special piece). With addSpecial, BOS comes first when AddBOS is set
// and EOS last when AddEOS is set (tokenizer.ggml.add_bos_token and
// add_eos_token; New sets AddBOS, as llama.cpp does for SentencePiece,
// and NewBPE for the Llama 3 pre-tokenizers).
//
// # Decoding
//
// Decode concatenates the pieces and skips control pieces. SentencePiece
// pieces have "▁" back to a space and byte pieces as their byte, and the
// one space that AddSpacePrefix put first is dropped; for every text that
// does not contain "▁" itself and a vocabulary with all 256 byte pieces,
// Decode(Encode(text)) is the text, byte for byte, valid UTF-8 or not.
// (SentencePiece has the same exception: a "▁" in the input comes back as
// a space.) Byte-level pieces go back through bytes_to_unicode to the
// bytes they stand for, so that Decode(Encode(text)) is the text for any
// text a vocabulary with all 256 byte characters encodes without special
// pieces; user-defined pieces are output as they are, unknown and unused
// ones not at all.
//
// # Training
//
// Train learns a vocabulary from texts as SentencePiece's BPE trainer
// does: the texts are normalised as Encode does it and split into words
// (at each "▁", around runs of other whitespace such as "\n", and where
// the Unicode script changes), the distinct words are counted, the
// characters covering 99.95% of the text become pieces (the rest are
// left to byte fallback), and then the most frequent adjacent pair is
// merged into a new piece, again and again, up to the size asked for.
// A merged piece scores minus its rank, so that Encode applies the merges
// in the order they were learned; each word is kept split as Encode would
// split it. Pair counts are updated incrementally through an index from
// each candidate piece to the words that hold it, so a merge costs time
// in proportion to the words it touches. Bad configurations and texts
// without a character are errors wrapping ErrTrain.
//
// # Files
//
// A Tokenizer is made from pieces, scores and kinds (New), which is how
// GGUF stores it (tokenizer.ggml.tokens, .scores, .token_type), with the
// merges and pre-tokenizer for byte-level BPE (NewBPE), or read from
// llama2.c's tokenizer.bin (ReadLlama2C: the longest piece's length, then
// per piece its float32 score, int32 length and bytes), whose pieces hold
// spaces where SentencePiece has "▁". Package model reads and writes the
// GGUF metadata. Constructors and readers check every length against the
// input and return errors wrapping ErrFormat (attn.ErrUnsupported for an
// unknown pre-tokenizer); they never panic (fuzzed).
package tokenizer
