// Package hugepage asks the operating system to back large buffers with
// transparent huge pages.
//
// Streaming reads of a buffer much larger than the last-level cache (the
// KV cache of a long context, the bandwidth probe) run faster on 2 MiB
// pages than on 4 KiB ones: the hardware prefetchers stop at page
// boundaries and every 4 KiB page costs a TLB miss. Linux backs an
// anonymous mapping with huge pages only where it is told to when
// /sys/kernel/mm/transparent_hugepage/enabled says [madvise], the default
// of many distributions, and the Go runtime does not tell it for the
// heap.
//
// Measured on the development machine (AMD EPYC Zen 3, 2 vCPUs, THP
// "madvise"), one process, caches with and without the advice, 31
// interleaved rounds, medians of two runs: a KV-cache decode step (H =
// 32, Hkv = 8, D = 128, 16k and 64k positions) ran 5–11% faster with
// float32 storage and 8–19% faster with bf16; the streaming probe read
// from −1% to 19% faster, so the step's fraction of the probe moved
// little (54–79% either way).
package hugepage

// Size is the huge page size Advise aligns to.
const Size = 2 << 20

// MinBytes is the smallest buffer Advise acts on: smaller ones hold at
// most one whole huge page, not worth a system call.
const MinBytes = 4 << 20
