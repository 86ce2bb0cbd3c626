// Package performer approximates softmax attention with FAVOR+ random
// features (Choromanski et al., 2021, "Rethinking Attention with
// Performers"). exp(q·k) is the expectation over w ~ N(0, I) of
// exp(w·q − |q|²/2)·exp(w·k − |k|²/2), so with m random vectors the
// positive features
//
//	φ(x) = m^(−1/2)·exp(W·x − |x|²/2)
//
// give φ(q)·φ(k), an unbiased estimate of exp(q·k), and attention becomes
// linear attention with φ (package linear): O(n·m·D) instead of O(n²·D).
// Queries and keys are scaled by scale^(1/2) each (d^(−1/4) with the
// default scale 1/sqrt(d)), so the estimate is of exp(scale·q·k); a
// negative scale flips the queries' sign.
//
// # Features
//
// W has m rows (Config.Features, default 256) drawn once per head size d
// from PCG(Seed, d), the first time d is used, and shared by all batch
// rows, heads, queries and keys: blocks of d orthogonal rows
// (Gram–Schmidt on Gaussian blocks), each row scaled by an independent
// chi(d) norm, which lowers the estimator's variance against i.i.d. rows.
// The first rows do not depend on m. The same seed gives the same output.
//
// Kind Trig selects the sin/cos random Fourier features of seed 000's
// sample code instead: exp(|x|²/2)·[sin(Wx), cos(Wx)] with m/2 random
// vectors. They estimate the same kernel, but their weights can be
// negative and their variance is largest where softmax weights are small,
// so normalisers come out near 0 or negative and outputs blow up; the
// accuracy report shows the two side by side. Positive features are the
// default for that reason. A trig row whose estimated normaliser is not
// positive gets out 0 and lse -Inf.
//
// # Stabilisers and causality
//
// Each query's features are divided by exp of their own largest exponent,
// which cancels in out and is added back into lse. Keys carry the same
// per-row scale, and package linear combines them with a running maximum
// over only the keys a query can see, rescaling its carried state when the
// maximum grows. Nothing is taken over the whole sequence, so in causal
// mode outputs up to t do not change at all when tokens after t change
// (unlike performer-pytorch #82), and inputs ×100 produce no Inf or NaN.
// Causal attention uses linear's chunked prefix sums: a dense block per
// chunk of 64 queries and a carried state, all matrix products. Padding
// keys are removed after the feature map: they enter neither numerator
// nor normaliser (performer-pytorch #89).
//
// With positive features the normaliser cannot be negative, but far
// beyond unit scale (|x·scale^(1/2)|² in the hundreds) it can underflow
// float32; such rows are computed exactly over the keys they see, so they
// still never depend on later tokens. At those scales the estimator's
// relative variance, about (exp(|q'+k'|²)−1)/m, is astronomical anyway.
//
// # Accuracy
//
// Error falls as m^(−1/2) and grows quickly with the norm of the scaled
// inputs. Relative error of out against exact attention (N = M = 64,
// D = 32, mean of 6 seeds, TestErrorFallsWithFeatures), inputs of unit
// scale (entries of size d^(−1/4), so |q·scale^(1/2)| ≈ 1):
//
//	m       64     256    1024   4096
//	error   0.25   0.14   0.068  0.035
//
// With standard-normal entries (|q·scale^(1/2)|² = sqrt(d)) the error at
// m = 256 is above 1 for positive features and far larger for trig ones
// (TestPositiveBeatsTrig): FAVOR+ needs small query and key norms.
//
// # lse
//
// lse is the log of the estimated softmax normaliser Σ_j exp(scale·q_i·k_j),
// stabilisers included: an estimate of exact attention's lse, so results
// merge with attn.Merge as estimates. Below Min it is exact.
//
// # Fallback
//
// Performer approximates softmax attention, so below Config.Min keys
// (default DefaultMin = 2048, DefaultMinCausal = 4096 under the causal
// mask, where exact attention does half the work) Forward computes exact
// attention with package flash instead: there exact attention is faster
// than 256 features (BenchmarkForward measures the crossing) as well as
// exact. Fallback (attn.Fallbacker) says, for a call, whether and why
// Forward does so; MinFor gives the threshold. A negative Min never
// falls back.
//
// # Decoding
//
// NewDecoder returns package linear's Decoder over the same features: a
// recurrent state of m·(D+1) numbers per sequence and kv head, O(m·D) per
// token and head. It always uses the random features, never exact
// attention, whatever the length (it keeps no keys to attend exactly), so
// it matches Forward with a negative Min; and its rows are not recomputed
// when a normaliser underflows (they get out 0 and lse -Inf). NewState is
// the bare state.
//
// # Gradients
//
// Backward (attn.Differentiable) is the gradient of the function Forward
// computed: below MinFor, exact attention's backward pass (package
// flash); else the gradient through the random features, W fixed by the
// seed and getting none, carried out by package linear's Backward with
// the map's MapBackward (the transposed Jacobian of φ, both kinds). It
// uses Forward's stabilisers, the running maximum over the keys a query
// sees, which cancel between the estimate's numerator and its
// normaliser: no exponential of a feature's scale is formed, and under
// the causal mask the gradients of a prefix's loss do not depend on
// later tokens. Rows whose normaliser underflowed, which Forward computed
// exactly, get the exact gradient of their softmax row. The cost is about
// three forward passes; BenchmarkBackwardRatio measures it.
//
// Where a row's normaliser is within a few orders of magnitude of the
// float32 underflow but not past it (far beyond unit scale, as above),
// the gradients can overflow to Inf or NaN: see linear.Attention.Backward.
//
// # NaN and infinities
//
// As in PyTorch, a NaN or an infinity in q, or in a k or v row a query
// sees, makes that query's row NaN in out and lse (package linear); the
// other rows do not change.
//
// # Errors
//
// Bad configurations are errors from New; bad shapes and options return
// errors wrapping attn.ErrShape or attn.ErrInput; a cancelled context
// stops the pass and returns its error.
package performer
