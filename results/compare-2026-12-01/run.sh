#!/bin/bash
cd /work/main
D=../shared/data/austen
T=$D/emma.txt.gz,$D/pride.txt.gz,$D/sense.txt.gz,$D/mansfield.txt.gz,$D/northanger.txt.gz
for a in exact window:left=64 strided:stride=16 longformer:left=64,globals=0 bigbird:block=16 linear performer:features=64,min=0 reformer:min=0,bucket=32,hashes=2 hyper:min=0,block=64,samples=64; do
  name=${a%%:*}
  /tmp/attn-c train -text $T -val $D/persuasion.txt.gz -val-tokens 16384 -ctx 512 -dim 128 -hidden 352 -layers 4 -heads 4 -kv-heads 2 \
    -batch 4 -steps 250 -warmup 15 -lr 2e-3 -eval 50 -save 1000 -attn "$a" -o /tmp/cmp/$name.gguf > /tmp/cmp/$name.log 2>&1
done
echo done > /tmp/cmp/DONE
