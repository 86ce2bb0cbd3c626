#!/bin/sh
# bf16 prefill: the new tile (avx512bf16) against the path it replaces on this
# machine (-kernels avx512: Q, K, V widened to float32) and float32 inputs.
A=/root/w/attn
for round in 1 2; do
  for v in tile widened f32; do
    case $v in
      tile) args="-dtype bf16";;
      widened) args="-dtype bf16 -kernels avx512";;
      f32) args="-dtype f32";;
    esac
    $A bench -mech exact $args -input gaussian -heads 8 -d 128 -n 1024,4096,16384 -reps 5 -out d128-$v-$round > d128-$v-$round.txt 2>&1
  done
done
for v in tile widened f32; do
  case $v in
    tile) args="-dtype bf16";;
    widened) args="-dtype bf16 -kernels avx512";;
    f32) args="-dtype f32";;
  esac
  $A bench -mech exact $args -input gaussian -heads 8 -d 64 -n 1024,4096,16384 -reps 5 -out d64-$v > d64-$v.txt 2>&1
done
echo done > done
