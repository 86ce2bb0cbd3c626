#!/bin/sh
# bf16 prefill: the new tile (avx512bf16) against the path it replaces on this
# machine (-kernels avx512: Q, K, V widened to float32) and float32 inputs.
A=/root/w/attn
# run D SUFFIX: the three variants at head size D, into dD-variantSUFFIX.
run() {
  for v in tile widened f32; do
    case $v in
      tile) args="-dtype bf16";;
      widened) args="-dtype bf16 -kernels avx512";;
      f32) args="-dtype f32";;
    esac
    $A bench -mech exact $args -input gaussian -heads 8 -d $1 -n 1024,4096,16384 -reps 5 -out d$1-$v$2 > d$1-$v$2.txt 2>&1
  done
}
run 128 -1
run 128 -2
run 64
echo done > done
