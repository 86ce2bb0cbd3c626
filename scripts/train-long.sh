#!/usr/bin/env bash
# Trains the long-context retrieval model from the embedded Austen model,
# short to long (README, "The long-context model"). Each phase
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

# A0: the rotary base raised from 10000 to 50000 and the task mixed in at
# weight 1, from the embedded model (the first run of 2026-12-01 stopped
# it at step 650 and went on from its step-600 checkpoint, a0.gguf).
if [ ! -f "$W/a0.gguf" ]; then
	phase a0 -init austen -ctx 1024 -rope-base 50000 -batch 4 -steps 600 -warmup 30 -lr 1e-3 -min-lr 1e-4
fi
START=${START:-$W/a0.gguf}
# A: the retrieval task at 512 tokens, its answers weighted 20.
phase a -init "$START" -ctx 512 -batch 8 -steps 600 -warmup 20 -lr 1e-3 -min-lr 1e-4 -answer-weight 20
# A2: 800 more steps at 512 tokens: at the end of A the answer's digits
# cost about 1 nat each (2.3 at chance), so the copy was being learnt,
# but greedy answers were still wrong.
phase a2 -init "$W/a.gguf" -ctx 512 -batch 8 -steps 800 -warmup 20 -lr 1e-3 -min-lr 1e-4 -answer-weight 20
# B: 2k tokens.
phase b -init "$W/a2.gguf" -ctx 2048 -batch 2 -steps 200 -warmup 10 -lr 5e-4 -min-lr 5e-5 -answer-weight 10
# C: 8k tokens.
phase c -init "$W/b.gguf" -ctx 8192 -batch 1 -steps 150 -warmup 10 -lr 3e-4 -min-lr 3e-5 -answer-weight 10
