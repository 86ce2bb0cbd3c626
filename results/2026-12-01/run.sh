#!/bin/bash
cd /work/main
A=/tmp/attn-m
M=/tmp/meas
$A bench -mode decode -mech exact,window,linear,performer,hyper,quest,magicpig -n 4096,65536,131072 -kv-heads 8 -dtype f32 -set window:left=256 -reps 9 -budget 20m -call-budget 5m -format json > $M/decode.json 2> $M/decode.err
$A bench -mode decode -mech exact -n 16384,65536 -kv-heads 8 -dtype bf16 -reps 15 -format json > $M/decode-bf16.json 2> $M/decode-bf16.err
$A bench -mode decode -mech exact -n 16384,65536 -kv-heads 8 -dtype f32 -reps 15 -format json > $M/decode-f32.json 2> $M/decode-f32.err
$A bench -mode decode -mech exact -n 65536 -kv-heads 8 -dtype i4 -reps 15 -format json > $M/decode-i4.json 2> $M/decode-i4.err
go test -run XX -bench GenerateLong -benchtime 2x ./model > $M/generate.txt 2>&1
HYPER_BENCH_N=131072 HYPER_BENCH_EXACT_N=16384 go test -run XX -bench 'Backward' -benchtime 2x ./hyper > $M/hyper-bwd.txt 2>&1
$A bench -mode train -mech exact,window,strided,longformer,bigbird,linear,performer,linformer,reformer,hyper -set min=0 -input gaussian -heads 8 -d 64 -n 2048,8192 -reps 3 -budget 15m -format json > $M/train.json 2> $M/train.err
for k in avx512bf16 avx2; do for d in 64 128; do $A bench -kernels $k -mech exact -input gaussian -heads 8 -d $d -n 512,1024,4096,16384 -reps 5 -format json > $M/prefill-$k-d$d.json 2> $M/prefill-$k-d$d.err; done; done
echo done > $M/DONE
