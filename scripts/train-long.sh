#!/usr/bin/env bash
# Trains the long-context retrieval model from the embedded Austen model,
# short to long (docs: README, "The long-context model"). Each phase
# checkpoints every 100 steps; rerunning this script resumes a phase from
# its checkpoint, and skips a phase whose model is already written.
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
	$ATTN train -text "$TEXT" -val "$D/persuasion.txt.gz" -val-tokens 16384 -val-needle 6 \
		-retrieval 1 -facts 4 -type f16 -checkpoint "$W/$name.ckpt.gguf" -save 100 -eval 100 \
		"${start[@]}" -o "$W/$name.gguf" "$@"
}

# A: the retrieval task at 1k tokens, with the rotary base raised from
# 10000 for the longer contexts to come.
phase a -init austen -ctx 1024 -rope-base 50000 -batch 4 -steps 900 -warmup 30 -lr 1e-3 -min-lr 1e-4
# B: the same at 8k tokens.
phase b -init "$W/a.gguf" -ctx 8192 -batch 1 -steps 400 -warmup 20 -lr 5e-4 -min-lr 5e-5
