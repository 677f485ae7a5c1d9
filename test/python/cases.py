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


def call_rank(ws, pattern, dtype, tokens, hidden, rank, strategy=None):
    """Rank `rank`'s call; returns its outputs by name."""
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
    returned = fiar.allreduce_fusion(x, ws, pattern, strategy=strategy, **outs, **kw)
    assert returned is outs.get("norm_out", outs.get("output"))
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


def mismatches(got, want):
    """Elements whose bits differ, per output."""
    return {name: int(np.count_nonzero(got[name].view(np.uint8).reshape(got[name].shape + (-1,)) !=
                                       want[name].view(np.uint8).reshape(want[name].shape + (-1,))))
            for name in want}
