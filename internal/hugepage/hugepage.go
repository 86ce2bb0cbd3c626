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
// Huge pages make a KV-cache decode step and the streaming probe faster
// by a few to twenty percent where the kernel honours the advice; the
// README's decode section gives the figures measured when it was added.
package hugepage

// Size is the huge page size Advise aligns to.
const Size = 2 << 20

// MinBytes is the smallest buffer Advise acts on: smaller ones hold at
// most one whole huge page, not worth a system call.
const MinBytes = 4 << 20
