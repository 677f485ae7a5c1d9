# SPDX-License-Identifier: Apache-2.0
"""The numpy reference of fiar's Python tests: the documented numerics (docs/design.md, "Fusion numerics") restated
with numpy's IEEE float32 / float16 arithmetic, independently of fiar's code. Inputs are made here too, so a rank
(thread or process) and the checker build the same tensors from (rank, call, shape)."""
import numpy as np

F32 = np.float32
F64 = np.float64


def inputs(dtype, tokens, hidden, rank, call=0):
    """Rank `rank`'s all-reduce input: values of both signs over a few magnitudes (no -0: the plain tests of the C++
    suite cover the special values)."""
    rng = np.random.default_rng(1000 * rank + 17 * call + tokens)
    x = rng.uniform(-8, 8, size=(tokens, hidden)) * np.exp2(rng.integers(-2, 3, size=(tokens, hidden)))
    return x.astype(dtype)


def weights(dtype, hidden, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.25, 1.5, size=(hidden,)).astype(dtype)


def residual(dtype, tokens, hidden):
    rng = np.random.default_rng(77 + tokens)
    return rng.uniform(-4, 4, size=(tokens, hidden)).astype(dtype)


def rank_sum(parts, dtype):
    """fiar's sum: fp32 in rank order from +0, rounded once to the element type (never -0)."""
    acc = np.zeros(parts[0].shape, dtype=F32)
    for p in parts:
        acc = acc + p.astype(F32)
    out = acc.astype(dtype)
    return np.where(out == 0, np.zeros_like(out), out)


def fma32(a, b, c):
    """float32 a x b + c rounded once: the product is exact in float64, the sum exact as s + e (TwoSum), and s only
    rounds differently from the exact sum when it sits on a float32 midpoint, where e decides."""
    a64, b64, c64 = a.astype(F64), b.astype(F64), c.astype(F64)
    p = a64 * b64
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(F32)
    r64 = r.astype(F64)
    up = np.nextafter(r, F32(np.inf))
    down = np.nextafter(r, F32(-np.inf))
    at_mid_up = (s - r64) * 2 == up.astype(F64) - r64
    at_mid_down = (r64 - s) * 2 == r64 - down.astype(F64)
    r = np.where(at_mid_up & (e > 0), up, r)
    return np.where(at_mid_down & (e < 0), down, r)


def _butterfly(x):
    """Pairs i, i ^ 16, then i ^ 8, ... i ^ 1 over the last axis (32 wide); element 0 of the result."""
    x = x.copy()
    m = 16
    while m > 0:
        x = x + x[..., np.arange(32) ^ m]
        m //= 2
    return x[..., 0]


def canonical_sum(q):
    """The canonical token sum of per-vector values q [tokens, vecs] (exec::canonical_token_sum, restated)."""
    tokens, vecs = q.shape
    chunks = (vecs + 31) // 32
    padded = np.zeros((tokens, chunks * 32), dtype=F32)
    padded[:, :vecs] = q
    partial = np.zeros((tokens, 32), dtype=F32)
    for j in range(chunks):
        partial[:, j % 32] = partial[:, j % 32] + _butterfly(padded[:, 32 * j:32 * (j + 1)])
    return _butterfly(partial)


def rmsnorm(y, gamma, eps, weight_bias):
    """fiar's RMSNorm of the element-type rows y [tokens, hidden] with gamma."""
    dtype = y.dtype
    tokens, hidden = y.shape
    per_vec = 16 // dtype.itemsize
    f = y.astype(F32).reshape(tokens, hidden // per_vec, per_vec)
    q = np.zeros(f.shape[:2], dtype=F32)
    for i in range(per_vec):
        q = fma32(f[:, :, i], f[:, :, i], q)
    ss = canonical_sum(q)
    mean = (ss.astype(F64) * (1.0 / hidden)).astype(F32)
    s = F32(1) / np.sqrt(mean + F32(eps))
    n = (y.astype(F32) * s[:, None]) * (F32(weight_bias) + gamma.astype(F32))[None, :]
    return n.astype(dtype)


def add_round(a, b):
    return (a.astype(F32) + b.astype(F32)).astype(a.dtype)


def moe_contribution(rows, idx, expert_scale, shared, routed_scaling_factor, dtype):
    """A rank's MoE finalize: per token, fma over its experts in k order (-1 skipped), + shared, rounded once."""
    tokens, top_k = idx.shape
    acc = np.zeros((tokens, rows.shape[1]), dtype=F32)
    for k in range(top_k):
        w = (expert_scale[:, k].astype(F32) * F32(routed_scaling_factor)).astype(F32)
        picked = rows[np.clip(idx[:, k], 0, None)].astype(F32)
        acc = np.where((idx[:, k] >= 0)[:, None], fma32(picked, np.broadcast_to(w[:, None], picked.shape), acc), acc)
    if shared is not None:
        acc = acc + shared.astype(F32)
    out = acc.astype(dtype)
    return np.where(out == 0, np.zeros_like(out), out)


def moe_inputs(dtype, tokens, hidden, rank, top_k=4):
    """Rank `rank`'s permuted expert output, its map (with holes) and router weights, and a shared expert output."""
    rng = np.random.default_rng(500 + rank)
    rows = tokens * top_k + 3
    x = rng.uniform(-2, 2, size=(rows, hidden)).astype(dtype)
    idx = rng.permutation(tokens * top_k).reshape(tokens, top_k).astype(np.int32)
    idx[(np.arange(tokens)[:, None] + np.arange(top_k)[None, :] + rank) % 5 == 0] = -1
    scale = (0.125 * (1 + rng.integers(0, 7, size=(tokens, top_k)))).astype(F32)
    shared = rng.uniform(-1, 1, size=(tokens, hidden)).astype(dtype)
    return x, idx, scale, shared
