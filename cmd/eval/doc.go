// Package eval measures attention mechanisms against each other: how far
// an output is from exact attention, how long a call takes and how much
// memory it allocates, and it turns those measurements into the tables,
// results.json and report.html of `attn bench` and `attn accuracy`.
//
// # Error metrics
//
// With O the reference output (exact attention, or the float64 reference
// for exact itself) and Ô the output under test, both [B][H][N][D]:
//
//   - relative Frobenius error ‖Ô−O‖_F / ‖O‖_F over the whole tensor;
//   - max row error max_i ‖ô_i−o_i‖₂ / ‖o_i‖₂ over query rows (a row whose
//     reference is zero, one that sees no key, counts its absolute error);
//   - relative error of the log-sum-exp ‖L̂−L‖₂ / ‖L‖₂ over the rows whose
//     reference is finite, and the largest |L̂−L|, which is |log Ẑ/Z|;
//   - the spectral-norm error max over (batch row, head) of
//     ‖Ê−E‖₂ / ‖O‖₂ of the N×D matrices, each ‖·‖₂ estimated by power
//     iteration on the D×D Gram matrix (HyperAttention's guarantee is in
//     this norm).
//
// NaN or ±Inf in an output makes every metric +Inf, so that a comparison
// against a tolerance fails.
//
// # Time and memory
//
// Measure calls a function once to warm up, counting the bytes it
// allocates on the Go heap (runtime.MemStats.TotalAlloc, which is exact
// because ReadMemStats flushes every P's cache), then times up to Reps
// further calls and reports their median, minimum and maximum. Allocated
// bytes are an upper bound on the call's peak extra heap, not a resident
// set size: memory the call frees and allocates again counts twice, and
// goroutine stacks do not count. A panic in the measured function is
// returned as an error, so one broken mechanism cannot end a sweep.
//
// GFLOP/s is quoted for exact attention only, by the convention of
// FlashAttention: 4·B·H·N·M·D flops, half of it under a causal mask.
//
// # Reports
//
// Results is the results.json document (docs/DESIGN.md §5, plus the accuracy
// sweep); WriteReport renders it as one self-contained HTML page with PNG
// plots (gonum/plot) embedded as data URIs.
package eval
