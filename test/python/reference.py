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


# ---- quantization (docs/formats.md) ----

def _pow2_exponent(a):
    """floor(log2(a)) of positive finite float64 values, exactly (frexp: a = m 2^e, m in [0.5, 1))."""
    return np.frexp(a)[1] - 1


def e4m3(x):
    """CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) of float32 values, as bytes: nearest even, +-448
    at most, NaN as 0x7f, tiny values to a signed zero."""
    x = np.asarray(x, dtype=F32)
    sign = (np.signbit(x).astype(np.uint8) << 7).astype(np.uint8)
    a = np.abs(x.astype(F64))
    a = np.where(np.isfinite(a), a, 1e9)  # inf saturates (NaN handled below)
    e = np.maximum(_pow2_exponent(np.where(a > 0, a, 1.0)), -6)  # quantum 2^(e - 3); 2^-9 below 2^-6
    v = np.minimum(np.rint(a / np.exp2(e - 3)) * np.exp2(e - 3), 448.0)
    sub = v < 2.0 ** -6
    ev = _pow2_exponent(np.where(v > 0, v, 1.0))
    mant = np.where(sub, v / 2.0 ** -9, (v / np.exp2(ev) - 1) * 8)
    code = np.where(sub, mant, ((ev + 7) * 8) + mant).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7f), code | sign).astype(np.uint8)


def e4m3_value(code):
    code = np.asarray(code, dtype=np.uint8).astype(np.int64)
    e, m = (code >> 3) & 0xf, code & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * np.exp2(e - 7))
    return np.where(code & 0x80, -v, v).astype(F32)


_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1(x):
    """CUDA's e2m1 conversion of float32 values as 4-bit codes: nearest even, +-6 at most, NaN as +6 (0x7)."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x.astype(F64))
    a = np.where(np.isfinite(a), a, 1e9)
    step = np.exp2(np.maximum(_pow2_exponent(np.where(a > 0, a, 1.0)), 0) - 1)
    v = np.minimum(np.rint(a / step) * step, 6.0)
    code = np.searchsorted(_E2M1, v).astype(np.uint8)
    code = code | (np.signbit(x).astype(np.uint8) << 3)
    return np.where(np.isnan(x), np.uint8(0x7), code).astype(np.uint8)


def over_fp8_max(amax):
    """amax / 448 as fiar computes it: a fp64 product rounded to float32."""
    return (np.asarray(amax, F32).astype(F64) * (1.0 / 448.0)).astype(F32)


def fp8_static(n, scale):
    inv = F32(1) / F32(scale)
    return e4m3(n.astype(F32) * inv)


def fp8_dynamic(n):
    """Codes and per-token scales: scale = max(amax / 448, 1 / (512 x 448)), q = e4m3(n / scale)."""
    f = n.astype(F32)
    amax = np.abs(f).max(axis=1)
    s = amax / F32(448)
    scale = np.maximum(s, F32(1.0) / (F32(512) * F32(448)))
    return e4m3(f / scale[:, None]), scale


def group_scale(amax):
    """The power of two at or above max(amax / 448, 1e-10), float32."""
    y = np.maximum(over_fp8_max(amax), F32(1e-10))
    bits = y.view(np.uint32)
    bits = np.where(bits & 0x7fffff, (bits + 0x800000) & 0x7f800000, bits).astype(np.uint32)
    return bits.view(F32)


def fp8_group(n, group, packed):
    """Codes, and the scale tensor's bytes as fiar writes them: [tokens, C] 4-byte elements, strides (1, R)."""
    tokens, hidden = n.shape
    f = n.astype(F32)
    groups = hidden // group
    amax = np.abs(f.reshape(tokens, groups, group)).max(axis=2)
    y = group_scale(amax)
    inv = np.exp2(-np.log2(y.astype(F64))).astype(F32)  # exact: y is a power of two
    codes = e4m3(f.reshape(tokens, groups, group) * inv[:, :, None]).reshape(tokens, hidden)
    rows = (tokens + 3) // 4 * 4
    cols = (groups + 3) // 4 if packed else groups
    words = np.zeros(tokens + (cols - 1) * rows, dtype=np.uint32)
    for c in range(cols):
        if packed:
            col = np.zeros(tokens, dtype=np.uint32)
            for j in range(4):
                g = 4 * c + j
                if g < groups:
                    col |= (y[:, g].view(np.uint32) >> 23).astype(np.uint32) << (8 * j)
        else:
            col = y[:, c].view(np.uint32)
        words[c * rows:c * rows + tokens] = col
    return codes, words.view(np.uint8)


def block_scale_offsets(tokens, cols, swizzled):
    """Where the scale of (row m, column k) goes, [tokens, cols]; and the tensor's bytes."""
    m = np.arange(tokens)[:, None]
    k = np.arange(cols)[None, :]
    if not swizzled:
        return m * cols + k, tokens * cols
    kp = (cols + 3) // 4 * 4
    offset = (m // 128) * (kp // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    return offset, (tokens + 127) // 128 * 128 * kp


def nvfp4(n, global_scale, swizzled):
    """Packed e2m1 codes [tokens, hidden / 2] and the e4m3 block scales in their layout."""
    tokens, hidden = n.shape
    f = n.astype(F32).reshape(tokens, hidden // 16, 16)
    g = F32(global_scale)
    amax = np.abs(f).max(axis=2)
    sf = e4m3(g * (amax * F32(1.0 / 6.0)))
    dec = e4m3_value(sf)
    factor = np.where(dec == 0, F32(0), g / np.where(dec == 0, F32(1), dec)).astype(F32)
    q = e2m1(f * factor[:, :, None]).reshape(tokens, hidden)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    offset, size = block_scale_offsets(tokens, hidden // 16, swizzled)
    scales = np.zeros(size, dtype=np.uint8)
    scales[offset] = sf
    return packed, scales


def e8m0_up(x):
    """The biased exponent of the smallest power of two at or above x (x >= 0, float32), saturating at 254."""
    bits = np.asarray(x, F32).view(np.uint32)
    e = (bits >> 23).astype(np.int64)
    e = np.where((bits & 0x7fffff) != 0, e + 1, e)
    return np.clip(e, 0, 254).astype(np.uint8)


def mxfp8(n, swizzled):
    tokens, hidden = n.shape
    f = n.astype(F32).reshape(tokens, hidden // 32, 32)
    amax = np.abs(f).max(axis=2)
    sf = np.where(amax == 0, np.uint8(0), e8m0_up(over_fp8_max(amax))).astype(np.uint8)
    factor = np.where(amax == 0, F32(0), np.exp2(127.0 - sf.astype(F64)).astype(F32)).astype(F32)
    codes = e4m3(f * factor[:, :, None]).reshape(tokens, hidden)
    offset, size = block_scale_offsets(tokens, hidden // 32, swizzled)
    scales = np.zeros(size, dtype=np.uint8)
    scales[offset] = sf
    return codes, scales
