#!/usr/bin/env bash
# Trains the long-context retrieval model from scratch, short to long
# (results/long/README.md says why this order and how far it got: phases
# i and t give a model that copies and answers some needle cases at 256
# tokens; the longer phases answer only near their own length so far, so
# nothing is embedded yet).
# Each phase checkpoints every 100 steps; rerunning this script resumes a
# phase from its checkpoint, and skips a phase whose model is already
# written.
# Usage: scripts/train-long.sh [WORKDIR]   (default: train-long/)
set -euo pipefail
cd "$(dirname "$0")/.."
D=${ATTN_SHARED:-../shared}/data/austen
W=${1:-train-long}
mkdir -p "$W"
TEXT=$D/emma.txt.gz,$D/pride.txt.gz,$D/sense.txt.gz,$D/mansfield.txt.gz,$D/northanger.txt.gz
ATTN=${ATTN:-go run ./cmd/attn}

phase() { # name, then the phase's flags
	local name=$1
	shift
	if [ -f "$W/$name.gguf" ]; then
		echo "phase $name: $W/$name.gguf exists"
		return
	fi
	local start=()
	if [ -f "$W/$name.ckpt.gguf" ]; then
		start=(-resume "$W/$name.ckpt.gguf")
	fi
	$ATTN train -text "$TEXT" -val "$D/persuasion.txt.gz" -val-tokens 8192 \
		-checkpoint "$W/$name.ckpt.gguf" -save 100 "${start[@]}" -o "$W/$name.gguf" "$@"
}

# The mix of the later phases: 30% induction windows (random pieces whose
# second half copies stretches of the first), 50% windows with up to four
# planted facts of which two are asked for at the end, the rest text.
MIX=(-induction 0.3 -retrieval 0.5 -spread 0.5 -facts 4 -asks 2 -answer-weight 5 -val-needle 8 -eval 150)

# i: copying first, on nothing but induction windows at 128 tokens, from
# new weights with a small tied vocabulary: the loss sits at ln 512 for
# about 2,000 steps, then falls within a few hundred (the induction
# heads form). The rotary base is already the long one.
phase i -vocab 512 -tied -dim 128 -hidden 344 -layers 4 -heads 4 -kv-heads 2 -rope-base 500000 \
	-ctx 128 -batch 32 -steps 3000 -warmup 20 -lr 3e-3 -min-lr 1e-3 -induction 1 -eval 100
# t: the language, keeping the copying, at 256 tokens.
phase t -init "$W/i.gguf" -ctx 256 -batch 16 -steps 1500 -warmup 20 -lr 2e-3 -min-lr 5e-4 \
	-induction 0.4 -retrieval 0.3 -facts 2 -asks 1 -answer-weight 5 -val-needle 6 -eval 150
# a, b, c, d: retrieval at 1k, 2k, 4k and 8k tokens.
phase a -init "$W/t.gguf" -ctx 1024 -batch 4 -steps 600 -warmup 20 -lr 1.5e-3 -min-lr 3e-4 "${MIX[@]}"
phase b -init "$W/a.gguf" -ctx 2048 -batch 2 -steps 600 -warmup 20 -lr 1e-3 -min-lr 2e-4 "${MIX[@]}"
phase c -init "$W/b.gguf" -ctx 4096 -batch 1 -steps 400 -warmup 20 -lr 7e-4 -min-lr 1.5e-4 "${MIX[@]}"
phase d -init "$W/c.gguf" -ctx 8192 -batch 1 -steps 300 -warmup 10 -lr 5e-4 -min-lr 1e-4 -type f16 "${MIX[@]}"
