// Package tokenizer is a SentencePiece-style BPE tokenizer, as used by
// Llama and llama2.c: a vocabulary of pieces with scores, merged by score,
// with byte fallback for anything the vocabulary lacks.
//
// # Encoding
//
// Encode replaces every space with "▁" (U+2581) and, with AddSpacePrefix
// (the default for Llama vocabularies), puts one "▁" in front of a
// non-empty text. The text is split into UTF-8 characters (a byte that is
// not valid UTF-8 is a character of its own). Then, as SentencePiece's
// BPE does, the adjacent pair whose concatenation is a vocabulary piece
// with the highest score is merged, the leftmost on a tie, again and
// again until no adjacent pair forms a piece (a priority queue of pairs,
// O(n log n)). A symbol left that is not a piece is written as its bytes,
// with the <0xXX> byte pieces (a "▁" in it as the byte of a space), or
// as the unknown piece where a byte has no piece. Only pieces of kind
// Normal and UserDefined are matched in the text; control pieces such as
// <s> never are.
//
// # Decoding
//
// Decode concatenates the pieces, with "▁" back to a space and byte pieces
// as their byte, skips control pieces, and drops the one space that
// AddSpacePrefix put first. For every text that does not contain "▁"
// itself and a vocabulary with all 256 byte pieces, Decode(Encode(text))
// is the text, byte for byte, valid UTF-8 or not. (SentencePiece has the
// same exception: a "▁" in the input comes back as a space.)
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
// in proportion to the words it touches: a 4096-piece vocabulary from
// 3.5 MB of English takes about half a second on one core. Bad
// configurations and texts without a character are errors wrapping
// ErrTrain.
//
// # Files
//
// A Tokenizer is made from pieces, scores and kinds (New), which is how
// GGUF stores it (tokenizer.ggml.tokens, .scores, .token_type), or read
// from llama2.c's tokenizer.bin (ReadLlama2C: the longest piece's length,
// then per piece its float32 score, int32 length and bytes), whose pieces
// hold spaces where SentencePiece has "▁". Readers check every length
// against the input and return errors wrapping ErrFormat; they never
// panic (fuzzed).
package tokenizer
