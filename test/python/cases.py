# SPDX-License-Identifier: Apache-2.0
"""One fused call of fiar's Python API as a rank makes it (call_rank), and what every rank must get (expected): the
tensors of (pattern, dtype, tokens, hidden, rank) are made by reference.py on both sides."""
import numpy as np

import fiar
import reference as ref

P = fiar.AllReduceFusionPattern
EPS = 1e-5
WEIGHT_BIAS = 0.0
RSF = 2.5  # routed_scaling_factor of the MoE patterns

# The patterns the numpy reference covers, with the outputs each writes.
PATTERNS = {
    P.kAllReduce: ("output",),
    P.kARResidualRMSNorm: ("residual_out", "norm_out"),
    P.kARRMSNorm: ("norm_out",),
    P.kARResidualRMSNormPrePost: ("residual_out", "norm_out"),
    P.kMoEFinalizeAllReduce: ("output",),
    P.kMoEFinalizeARResidualRMSNorm: ("residual_out", "norm_out"),
}
MOE = (P.kMoEFinalizeAllReduce, P.kMoEFinalizeARResidualRMSNorm)

# The quantizing patterns (all after the residual norm): their format, whether they write norm_out, and the
# variant's parameters (the static scale given as a float or a tensor, the scale layout, the group scale format).
GROUP = 64  # block_quant_group_size: 4 groups of a 256-wide row
STATIC_SCALE = 0.05
GLOBAL_SCALE = 3.0  # NVFP4's global scale
QUANT = {
    P.kARResidualRMSNormFP8Quant: ("fp8", False, {"float_scale": True}),
    P.kARResidualRMSNormOutFP8Quant: ("fp8", True, {"float_scale": False}),
    P.kARResidualRMSNormFP4Quant: ("nvfp4", False, {"swizzled": False}),
    P.kARResidualRMSNormOutFP4Quant: ("nvfp4", True, {"swizzled": True}),
    P.kARResidualRMSNormPerTokenGroupFP8PackedQuant: ("group", False, {"packed": True}),
    P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant: ("group", True, {"packed": True}),
    P.kARResidualRMSNormDynamicFP8Quant: ("dynamic", False, {}),
    P.kARResidualRMSNormOutDynamicFP8Quant: ("dynamic", True, {}),
    P.kARResidualRMSNormMXFP8Quant: ("mxfp8", False, {"swizzled": False}),
    P.kARResidualRMSNormOutMXFP8Quant: ("mxfp8", True, {"swizzled": True}),
    P.kARResidualRMSNormPerTokenGroupFP8Float32Quant: ("group", False, {"packed": False}),
    P.kARResidualRMSNormOutPerTokenGroupFP8Float32Quant: ("group", True, {"packed": False}),
}


def quant_patterns(dtype):
    """The quantizing patterns an element type runs (NVFP4 takes 16-bit input)."""
    return [p for p, (kind, _, _) in QUANT.items() if kind != "nvfp4" or np.dtype(dtype).itemsize == 2]


def _as(tensor, kw):
    """kw with every numpy array passed through tensor() (torch.from_numpy: the same memory, as torch tensors)."""
    return {k: tensor(v) if tensor is not None and isinstance(v, np.ndarray) else v for k, v in kw.items()}


def call_quant(ws, pattern, dtype, tokens, hidden, rank, tensor=None):
    """Rank `rank`'s call of a quantizing pattern, every output buffer filled with 0xAA first (fiar writes every
    byte); returns the outputs by name (numpy), scale tensors as their whole storage in bytes. tensor: what the
    arrays are handed to fiar as (None: numpy; torch.from_numpy: torch tensors over the same memory)."""
    kind, with_norm, opt = QUANT[pattern]
    x = ref.inputs(dtype, tokens, hidden, rank)
    res = ref.residual(dtype, tokens, hidden)
    outs = {"residual_out": np.zeros((tokens, hidden), dtype=dtype)}
    if with_norm:
        outs["norm_out"] = np.zeros((tokens, hidden), dtype=dtype)
    kw = dict(residual_in=res, rms_gamma=ref.weights(dtype, hidden, 1), rms_eps=EPS, weight_bias=WEIGHT_BIAS)
    width = hidden // 2 if kind == "nvfp4" else hidden
    quant = np.full((tokens, width), 0xAA, dtype=np.uint8)
    storage = None
    if kind == "fp8":
        kw["scale_factor"] = STATIC_SCALE if opt["float_scale"] else np.array([STATIC_SCALE], dtype=np.float32)
    elif kind == "dynamic":
        kw["scale_out"] = storage = np.full((tokens, 1), np.nan, dtype=np.float32)
    elif kind == "group":
        rows, groups = (tokens + 3) // 4 * 4, hidden // GROUP
        cols = (groups + 3) // 4 if opt["packed"] else groups
        words = np.full(tokens + (cols - 1) * rows, 0xAAAAAAAA, dtype=np.uint32)
        view = words.view(np.int32 if opt["packed"] else np.float32)
        kw["scale_out"] = np.lib.stride_tricks.as_strided(view, shape=(tokens, cols), strides=(4, 4 * rows))
        kw["block_quant_group_size"] = GROUP
        storage = words
    else:  # nvfp4, mxfp8: the block scales in their layout
        cols = hidden // (16 if kind == "nvfp4" else 32)
        size = ref.block_scale_offsets(tokens, cols, opt["swizzled"])[1]
        kw["scale_out"] = storage = np.full(size, 0xAA, dtype=np.uint8)
        kw["layout_code"] = fiar.QuantizationSFLayout.SWIZZLED_128x4 if opt["swizzled"] else \
            fiar.QuantizationSFLayout.LINEAR
        if kind == "nvfp4":
            kw["scale_factor"] = np.array([GLOBAL_SCALE], dtype=np.float32)
    passed = _as(tensor, dict(outs, quant_out=quant, **kw))
    returned = fiar.allreduce_fusion(_as(tensor, {"x": x})["x"], ws, pattern, **passed)
    assert returned is passed.get("norm_out", passed["quant_out"])
    outs["quant_out"] = quant
    if storage is not None:
        outs["scales"] = storage.view(np.uint8).reshape(-1)
    return outs


def expected_quant(pattern, dtype, tokens, hidden, world):
    kind, with_norm, opt = QUANT[pattern]
    total = ref.rank_sum([ref.inputs(dtype, tokens, hidden, r) for r in range(world)], np.dtype(dtype))
    y = ref.add_round(total, ref.residual(dtype, tokens, hidden))
    n = ref.rmsnorm(y, ref.weights(dtype, hidden, 1), EPS, WEIGHT_BIAS)
    want = {"residual_out": y}
    if with_norm:
        want["norm_out"] = n
    if kind == "fp8":
        want["quant_out"] = ref.fp8_static(n, STATIC_SCALE)
    elif kind == "dynamic":
        want["quant_out"], scale = ref.fp8_dynamic(n)
        want["scales"] = scale.astype(np.float32).view(np.uint8)
    elif kind == "group":
        want["quant_out"], want["scales"] = ref.fp8_group(n, GROUP, opt["packed"])
    elif kind == "nvfp4":
        want["quant_out"], want["scales"] = ref.nvfp4(n, GLOBAL_SCALE, opt["swizzled"])
    else:
        want["quant_out"], want["scales"] = ref.mxfp8(n, opt["swizzled"])
    return want


def call_rank(ws, pattern, dtype, tokens, hidden, rank, strategy=None, tensor=None):
    """Rank `rank`'s call; returns its outputs by name (numpy). tensor: as call_quant's."""
    kw = {}
    if pattern in MOE:
        rows, idx, scale, shared = ref.moe_inputs(dtype, tokens, hidden, rank)
        x = rows
        kw.update(expanded_idx_to_permuted_idx=idx, expert_scale_factor=scale, shared_expert_output=shared,
                  routed_scaling_factor=RSF)
    else:
        x = ref.inputs(dtype, tokens, hidden, rank)
    outs = {name: np.zeros((tokens, hidden), dtype=dtype) for name in PATTERNS[pattern]}
    if pattern != P.kAllReduce and pattern != P.kMoEFinalizeAllReduce:
        kw.update(rms_gamma=ref.weights(dtype, hidden, 1), rms_eps=EPS, weight_bias=WEIGHT_BIAS)
    if pattern in (P.kARResidualRMSNorm, P.kARResidualRMSNormPrePost, P.kMoEFinalizeARResidualRMSNorm):
        kw["residual_in"] = ref.residual(dtype, tokens, hidden)
    if pattern == P.kARResidualRMSNormPrePost:
        kw["gamma_pre"] = ref.weights(dtype, hidden, 2)
    passed = _as(tensor, dict(outs, **kw))
    returned = fiar.allreduce_fusion(_as(tensor, {"x": x})["x"], ws, pattern, strategy=strategy, **passed)
    assert returned is passed.get("norm_out", passed.get("output"))
    for name in outs:  # tensors elsewhere (a GPU's) come back; torch.from_numpy's are the arrays' own memory
        if passed[name] is not outs[name] and hasattr(passed[name], "cpu"):
            np.copyto(outs[name], passed[name].cpu().numpy())
    return outs


def expected(pattern, dtype, tokens, hidden, world):
    """Every rank's outputs by the reference."""
    if pattern in MOE:
        parts = []
        for r in range(world):
            rows, idx, scale, shared = ref.moe_inputs(dtype, tokens, hidden, r)
            parts.append(ref.moe_contribution(rows, idx, scale, shared, RSF, dtype))
    else:
        parts = [ref.inputs(dtype, tokens, hidden, r) for r in range(world)]
    total = ref.rank_sum(parts, np.dtype(dtype))
    if pattern in (P.kAllReduce, P.kMoEFinalizeAllReduce):
        return {"output": total}
    gamma = ref.weights(dtype, hidden, 1)
    if pattern == P.kARRMSNorm:
        return {"norm_out": ref.rmsnorm(total, gamma, EPS, WEIGHT_BIAS)}
    res = ref.residual(dtype, tokens, hidden)
    if pattern == P.kARResidualRMSNormPrePost:
        y = ref.add_round(ref.rmsnorm(total, ref.weights(dtype, hidden, 2), EPS, WEIGHT_BIAS), res)
    else:
        y = ref.add_round(total, res)
    return {"residual_out": y, "norm_out": ref.rmsnorm(y, gamma, EPS, WEIGHT_BIAS)}


def wrong_bits(ws, dtype, tokens, hidden, rank, world, tensor=None):
    """Rank `rank` of `world` calls every pattern of the reference, the quantizing ones too, on ws; returns each
    pattern's differing elements per output ({str(pattern): {output: count}}). tensor: as call_quant's."""
    wrong = {str(p): mismatches(call_rank(ws, p, dtype, tokens, hidden, rank, tensor=tensor),
                                expected(p, dtype, tokens, hidden, world)) for p in PATTERNS}
    wrong.update({str(p): mismatches(call_quant(ws, p, dtype, tokens, hidden, rank, tensor=tensor),
                                     expected_quant(p, dtype, tokens, hidden, world)) for p in quant_patterns(dtype)})
    return wrong


def mismatches(got, want):
    """Elements whose bits differ, per output."""
    return {name: int(np.count_nonzero(got[name].view(np.uint8).reshape(got[name].shape + (-1,)) !=
                                       want[name].view(np.uint8).reshape(want[name].shape + (-1,))))
            for name in want}
