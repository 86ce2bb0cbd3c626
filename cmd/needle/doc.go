// Package needle is the needle-in-a-haystack test of a language model
// (`attn needle`): a fact hidden at some depth of a long text, a question
// about it at the end, and the model's greedy answer scored by exact
// match, over a grid of context lengths and depths, with the attention of
// the model's layers replaced by any mechanism of this module.
//
// # Cases
//
// A case is a prompt of exactly n tokens: BOS (when the tokenizer has
// one), a stretch of the haystack (by default Jane Austen's Persuasion,
// the novel the embedded model was held out from; any text otherwise)
// with the needle inserted at depth d of it, and the question. With the
// default templates the needle is
//
//	The special magic number for {key} is #{value}.
//
// the question
//
//	What is the special magic number for {key}? The special magic number for {key} is
//
// and the answer " #{value}". A key is an adjective and a noun drawn from
// two fixed lists of 64 ordinary English words ("silver lantern"), a value
// a 6-digit number. The value follows a mark the haystack does not use
// ('#' is in no Austen novel), as RULER's follows a colon: a model finds
// the needle from the question by that mark, and small vocabularies,
// which spell a key and a lone space in common pieces, give nothing else
// as distinctive to find it by. The key tells facts apart when a prompt
// holds several. The pieces are tokenized on their own and joined as
// tokens (see Builder), so that the length is exact; the needle goes at
// token round(d·m) of the m haystack tokens, moved to the nearest start
// of a word within 8 tokens, so depth 0 puts it first and depth 1 right
// before the question. A stretch that already holds the key or the value
// as words is drawn again: the needle is the one place the answer can
// be read from.
//
// Cases are drawn from a PCG generator seeded (Seed, n<<32 | trial): the
// key, the value and the stretch of the haystack depend on the seed, the
// length and the trial alone, so every depth of a trial hides the same
// fact in the same text, every mechanism answers the same prompts, and
// adding lengths or trials to a run does not change the others'. A
// haystack shorter than the longest prompt is repeated.
//
// # Answers and scoring
//
// Ask runs a case through a model.Session, whose every layer decodes
// through its mechanism's incremental decoder: the prompt in one step,
// then the answer one greedy token at a time (the most likely, the
// lowest id on a tie, as model.Sampler at temperature 0) until the answer
// is settled. Score compares texts, not token ids, because a tokenizer
// may split the value differently inside the needle's sentence and after
// the question: the answer is right when its text, leading white space
// aside, is what the model wrote, followed by nothing or by a character
// that is neither a letter nor a digit. The time per answer counts the
// prefill and the decoding.
//
// # Mechanisms
//
// A Mech is a named list of model patches: one `attn ppl -patch` spec
// (PatchMech), or, from MechsScaled, one mechanism in every layer with a
// budget scaled to the prompt's length (the registry's `attn patching`
// rule, about n/8 keys per query, and no fallback to exact attention).
// Rows record the patches they ran with. A mechanism that cannot decode
// causally (Linformer) gets rows that say why instead of stopping the run.
//
// # Results
//
// Run returns a Row per mechanism, length and depth (trials, correct
// answers, accuracy, seconds per answer), every answer, and the settings
// that repeat the run; WriteJSON writes them as needle.json, ReadJSON
// reads them back, WriteTable prints them, HeatMap draws a mechanism's
// accuracy as the usual picture (length across, depth down, colour from
// red at 0 through yellow to green at 1), AccuracyPlot every mechanism's
// accuracy over all depths against length, and WriteReport writes all of
// them to a folder.
//
// # Training
//
// Plant puts the same task into a training window: facts in the
// builder's templates at random depths and the question about one of them
// with its answer at the end, so that a model trained on such windows
// learns the retrieval that the test asks for.
//
// Prompts longer than the model's training context (Config.SeqLen) are
// run all the same: how a model does past its context is part of what the
// test shows.
package needle
