#!/usr/bin/env python3
"""Check `attn run` against numpy's softmax(Q·Kᵀ·scale)·V, outside Go.

Usage: python3 scripts/numpy_check.py [path/to/attn]   (needs numpy)
Writes random inputs with GQA, a causal mask with N < M and key padding,
runs attn on them and prints the relative errors of O and L.
"""
import os, subprocess, sys, tempfile
import numpy as np

attn = sys.argv[1] if len(sys.argv) > 1 else None
rng = np.random.default_rng()
B, H, Hkv, N, M, D = 2, 6, 2, 45, 77, 40
scale = 0.17
kvlen = [77, 60]
q = rng.standard_normal((B, H, N, D), dtype=np.float32)
k = rng.standard_normal((B, Hkv, M, D), dtype=np.float32)
v = rng.standard_normal((B, Hkv, M, D), dtype=np.float32)

with tempfile.TemporaryDirectory() as d:
    p = lambda n: os.path.join(d, n)
    np.save(p("q.npy"), q); np.save(p("k.npy"), k.astype(np.float64)); np.save(p("v.npy"), v)
    cmd = [attn] if attn else ["go", "run", "./cmd/attn"]
    subprocess.run(cmd + ["run", "-mech", "exact", "-q", p("q.npy"), "-k", p("k.npy"), "-v", p("v.npy"),
                          "-o", p("o.npy"), "-lse", p("l.npy"), "-causal", "-scale", str(scale),
                          "-kvlen", ",".join(map(str, kvlen))], check=True)
    o, l = np.load(p("o.npy")), np.load(p("l.npy"))

g = H // Hkv
kk = np.repeat(k, g, axis=1).astype(np.float64)  # expand heads for numpy only
vv = np.repeat(v, g, axis=1).astype(np.float64)
s = np.einsum("bhnd,bhmd->bhnm", q.astype(np.float64), kk) * scale
i = np.arange(N)[:, None] + (M - N)  # bottom-right aligned causal
j = np.arange(M)[None, :]
mask = (j <= i)[None, None] & (np.arange(M)[None, None, None, :] < np.array(kvlen)[:, None, None, None])
s = np.where(mask, s, -np.inf)
mx = s.max(-1, keepdims=True)
e = np.exp(s - mx)
want_l = (mx + np.log(e.sum(-1, keepdims=True)))[..., 0]
want_o = np.einsum("bhnm,bhmd->bhnd", e / e.sum(-1, keepdims=True), vv)
rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
print(f"O {o.dtype} {o.shape}: rel err {rel(o, want_o):.2e}")
print(f"L {l.dtype} {l.shape}: rel err {rel(l, want_l):.2e}")
assert o.dtype == np.float32 and o.shape == (B, H, N, D) and l.shape == (B, H, N)
assert rel(o, want_o) < 1e-5 and rel(l, want_l) < 1e-5
print("ok")
