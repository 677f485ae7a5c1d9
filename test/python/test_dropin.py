# SPDX-License-Identifier: Apache-2.0
"""The drop-in promise: engines' and FlashInfer's call sites run with fiar imported in flashinfer.comm's place (and
platform="host"), and fiar takes FlashInfer's call shapes as FlashInfer does: what a pattern does not use is ignored,
layout_code matters only where there are block scales, byte outputs are byte buffers, residual_out may be the input,
moe_finalize_backend takes FlashInfer's values; strict=True keeps fiar's own checks. The legacy trtllm entry points and
FlashInfer's workspace classes. test_call_sites.py (torch) runs the engines' call sites."""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fiar  # noqa: E402
import cases  # noqa: E402
import harness  # noqa: E402
import reference as ref  # noqa: E402

P = fiar.AllReduceFusionPattern
L = fiar.QuantizationSFLayout
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _threads(world, body, dtype=np.float16, tokens=4, hidden=256, backend="trtllm"):
    """body(ws, rank) on `world` thread ranks sharing one workspace each; returns what each returned (raises the
    first exception)."""
    def rank_body(rank, comm):
        with fiar.create_allreduce_fusion_workspace(backend, world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            return body(ws, rank)

    results = harness.run_threads(world, rank_body)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# ---- FlashInfer's call shapes, one by one ----

def test_what_a_pattern_does_not_use_is_ignored_and_untouched():
    """A plain sum given every buffer of the fused patterns (FlashInfer's test passes them all): a bf16 quant_out, a
    scale_out and a residual of other shapes, an int8 gamma, layout_code 1. None is checked or written; strict=True
    refuses them."""
    tokens, hidden = 4, 256

    def body(ws, rank):
        x = ref.inputs(np.float16, tokens, hidden, rank)
        junk = {"residual_in": np.full((3, 7), 5, np.int8), "residual_out": np.full((2, 2), 7, np.float32),
                "norm_out": np.full((tokens, hidden), 9, np.float16), "rms_gamma": np.full(3, 1, np.int8),
                "quant_out": np.full((tokens, hidden), 11, np.float32), "scale_out": np.full(5, 13, np.float64),
                "scale_factor": np.full((2, 2), 0.5, np.float32), "expanded_idx_to_permuted_idx": "not a tensor",
                "expert_scale_factor": np.full(3, 2, np.float16), "shared_expert_output": np.full(3, 4, np.int64)}
        before = {k: v.copy() for k, v in junk.items() if isinstance(v, np.ndarray)}
        out = np.zeros_like(x)
        got = fiar.allreduce_fusion(x, ws, P.kAllReduce, output=out, layout_code=L.SWIZZLED_8x4, **junk)
        untouched = all(np.array_equal(junk[k], before[k]) for k in junk if isinstance(junk[k], np.ndarray))
        with pytest.raises((TypeError, ValueError)):
            fiar.allreduce_fusion(x, ws, P.kAllReduce, output=out, strict=True, **junk)
        with pytest.raises(ValueError, match="layout_code 1"):
            fiar.allreduce_fusion(x, ws, P.kAllReduce, output=out, layout_code=L.SWIZZLED_8x4, strict=True)
        return got is out, untouched, out

    results = _threads(2, body, tokens=tokens, hidden=hidden)
    want = ref.rank_sum([ref.inputs(np.float16, tokens, hidden, r) for r in range(2)], np.dtype(np.float16))
    for returned, untouched, out in results:
        assert returned and untouched
        assert cases.mismatches({"output": out}, {"output": want}) == {"output": 0}


def test_norm_out_of_a_pattern_without_it_is_ignored():
    """vLLM passes norm_out to patterns 2 and 3, which do not write it: left as it was, the codes returned;
    strict=True names it."""
    tokens, hidden = 4, 256

    def body(ws, rank):
        norm = np.full((tokens, hidden), 3, np.float16)
        quant = np.zeros((tokens, hidden), np.uint8)
        kw = dict(residual_in=ref.residual(np.float16, tokens, hidden), residual_out=np.zeros((tokens, hidden),
                  np.float16), rms_gamma=ref.weights(np.float16, hidden, 1), rms_eps=cases.EPS,
                  scale_factor=cases.STATIC_SCALE)
        x = ref.inputs(np.float16, tokens, hidden, rank)
        got = fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP8Quant, norm_out=norm, quant_out=quant, **kw)
        with pytest.raises(ValueError, match="norm_out is set, but pattern 2 does not write it"):
            fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP8Quant, norm_out=norm, quant_out=quant, strict=True,
                                  **kw)
        return got is quant, (norm == 3).all(), quant

    want = cases.expected_quant(P.kARResidualRMSNormFP8Quant, np.float16, tokens, hidden, 2)["quant_out"]
    for returned, untouched, quant in _threads(2, body, tokens=tokens, hidden=hidden):
        assert returned and untouched
        assert cases.mismatches({"q": quant}, {"q": want}) == {"q": 0}


def test_byte_outputs_take_any_element_type():
    """quant_out and the NVFP4 block scales of another element type (FlashInfer's test: bf16 / fp16 buffers; vLLM:
    int32 scales viewed as float8) hold the same bytes as uint8 ones; strict=True asks for 8-bit tensors."""
    tokens, hidden = 4, 256
    cols = hidden // 16

    def body(ws, rank):
        x = ref.inputs(np.float16, tokens, hidden, rank)
        kw = dict(residual_in=ref.residual(np.float16, tokens, hidden), rms_gamma=ref.weights(np.float16, hidden, 1),
                  rms_eps=cases.EPS, scale_factor=np.array(cases.GLOBAL_SCALE, np.float32), layout_code=L.LINEAR)
        quant = np.zeros(tokens * hidden // 4, np.float16)  # twice the bytes the codes take
        scales = np.zeros(tokens * cols // 4, np.int32)
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP4Quant, quant_out=quant, scale_out=scales, **kw)
        with pytest.raises(TypeError, match="quant_out must be a uint8 tensor"):
            fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP4Quant, quant_out=quant, scale_out=scales,
                                  strict=True, **kw)
        return quant.view(np.uint8)[:tokens * hidden // 2].reshape(tokens, hidden // 2), scales.view(np.uint8)

    want = cases.expected_quant(P.kARResidualRMSNormFP4Quant, np.float16, tokens, hidden, 2)
    for codes, scales in _threads(2, body, tokens=tokens, hidden=hidden):
        assert cases.mismatches({"q": codes, "s": scales}, {"q": want["quant_out"], "s": want["scales"]}) == \
            {"q": 0, "s": 0}


def test_the_8x4_swizzle_is_refused_where_there_are_block_scales():
    """fiar has no 8x4 swizzle: NVFP4 and MXFP8 calls refuse it before anything runs, naming the fix; the workspace
    still works."""
    tokens, hidden = 4, 256

    def body(ws, rank):
        x = ref.inputs(np.float16, tokens, hidden, rank)
        kw = dict(residual_in=ref.residual(np.float16, tokens, hidden), rms_gamma=ref.weights(np.float16, hidden, 1),
                  quant_out=np.zeros((tokens, hidden), np.uint8), scale_out=np.zeros(128 * 16, np.uint8))
        for pattern in (P.kARResidualRMSNormFP4Quant, P.kARResidualRMSNormMXFP8Quant):
            with pytest.raises(ValueError, match=r"layout_code 1; allowed: .*pass SWIZZLED_128x4"):
                fiar.allreduce_fusion(x, ws, pattern, layout_code=L.SWIZZLED_8x4, scale_factor=1.0, **kw)
        return fiar.allreduce_fusion(x, ws, P.kAllReduce)

    want = ref.rank_sum([ref.inputs(np.float16, tokens, hidden, r) for r in range(2)], np.dtype(np.float16))
    for out in _threads(2, body, tokens=tokens, hidden=hidden):
        assert cases.mismatches({"o": out}, {"o": want}) == {"o": 0}


@pytest.mark.parametrize("backend,strategy", [("mnnvl", "oneshot"), ("mnnvl", "twoshot"), ("mnnvl", "multimem"),
                                              ("nccl", "auto")])
def test_residual_out_may_be_the_input(backend, strategy):
    """vLLM's sum beside the norm: a zero residual and residual_out = input; the same bits as into separate
    buffers, on every strategy and the nccl backend (the C++ suite: every backend, dtype and strategy)."""
    tokens, hidden = 6, 256

    def body(ws, rank):
        gamma, zero = ref.weights(np.float16, hidden, 1), np.zeros((tokens, hidden), np.float16)
        apart, sum_apart, norm_apart = ref.inputs(np.float16, tokens, hidden, rank), np.zeros_like(zero), \
            np.zeros_like(zero)
        fiar.allreduce_fusion(apart, ws, P.kARResidualRMSNorm, residual_in=zero, residual_out=sum_apart,
                              norm_out=norm_apart, rms_gamma=gamma, strategy=strategy)
        aliased, norm = ref.inputs(np.float16, tokens, hidden, rank), np.zeros_like(zero)
        fiar.allreduce_fusion(aliased, ws, P.kARResidualRMSNorm, residual_in=zero, residual_out=aliased,
                              norm_out=norm, rms_gamma=gamma, strategy=strategy)
        return aliased, sum_apart, norm, norm_apart

    total = ref.rank_sum([ref.inputs(np.float16, tokens, hidden, r) for r in range(2)], np.dtype(np.float16))
    for aliased, sum_apart, norm, norm_apart in _threads(2, body, tokens=tokens, hidden=hidden, backend=backend):
        assert cases.mismatches({"s": aliased, "n": norm}, {"s": sum_apart, "n": norm_apart}) == {"s": 0, "n": 0}
        assert cases.mismatches({"s": aliased}, {"s": total}) == {"s": 0}


def test_moe_finalize_backend_takes_flashinfers_values():
    tokens, hidden = 5, 64

    def body(ws, rank):
        rows, idx, scale, shared = ref.moe_inputs(np.float32, tokens, hidden, rank)
        outs = [fiar.allreduce_fusion(rows, ws, P.kMoEFinalizeAllReduce, expanded_idx_to_permuted_idx=idx,
                                      expert_scale_factor=scale, shared_expert_output=shared,
                                      routed_scaling_factor=cases.RSF, moe_finalize_backend=b)
                for b in (None, "trtllm", "cake", "fiar")]
        with pytest.raises(ValueError, match="moe_finalize_backend 'cutlass'; allowed: None, 'trtllm'"):
            fiar.allreduce_fusion(rows, ws, P.kMoEFinalizeAllReduce, expanded_idx_to_permuted_idx=idx,
                                  expert_scale_factor=scale, moe_finalize_backend="cutlass")
        return outs

    want = cases.expected(P.kMoEFinalizeAllReduce, np.float32, tokens, hidden, 2)["output"]
    for outs in _threads(2, body, dtype=np.float32, tokens=tokens, hidden=hidden):
        assert [cases.mismatches({"o": o}, {"o": want})["o"] for o in outs] == [0, 0, 0, 0]


# ---- FlashInfer's other entry points ----

def test_legacy_trtllm_entry_points():
    """trtllm_create_ipc_workspace_for_all_reduce_fusion + trtllm_allreduce_fusion on flattened tensors, as
    FlashInfer's legacy test calls them: the same bits as the unified call; its return shapes; its errors."""
    tokens, hidden, world = 4, 256, 2

    def body(rank, comm):
        handles, table, meta = fiar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            rank, world, 8, hidden, comm_backend=comm, create_metadata=True, platform="host")
        assert handles is table and meta["tp_size"] == world and meta["use_fp32_lamport"] is False
        outs = {}
        for dtype in (np.float16, "bfloat16"):
            np_dtype = np.float16 if dtype == np.float16 else __import__("ml_dtypes").bfloat16
            x = ref.inputs(np_dtype, tokens, hidden, rank).reshape(-1)
            res = ref.residual(np_dtype, tokens, hidden).reshape(-1)
            res_out, norm = np.zeros_like(x), np.zeros_like(x)
            fiar.trtllm_allreduce_fusion(x, world, rank, tokens, hidden, table, True, True, True,
                                         P.kARResidualRMSNorm, None, np.zeros_like(x), res, res_out, norm, None, None,
                                         ref.weights(np_dtype, hidden, 1), cases.EPS, None, None, metadata=meta)
            outs[str(np.dtype(np_dtype))] = res_out.reshape(tokens, hidden), norm.reshape(tokens, hidden)
        with pytest.raises(ValueError, match=r"use_fp32_lamport \(False\) does not match .*float32"):
            x32 = np.zeros(tokens * hidden, np.float32)
            fiar.trtllm_allreduce_fusion(x32, world, rank, tokens, hidden, table, True, True, True, P.kAllReduce,
                                         None, np.zeros_like(x32), None, None, None, None, None, None, 1e-6, None,
                                         None)
        with pytest.raises(ValueError, match="token_num 9 x hidden_dim 256"):
            fiar.trtllm_allreduce_fusion(np.zeros(9 * hidden, np.float16), world, rank, 9, hidden, table, True, True,
                                         True, P.kAllReduce, None, None, None, None, None, None, None, None, 1e-6,
                                         None, None)
        fiar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)
        four = fiar.trtllm_create_ipc_workspace_for_all_reduce_fusion(rank, world, 8, hidden, True, None, True, comm,
                                                                      True, platform="host")
        two = fiar.trtllm_create_ipc_workspace_for_all_reduce_fusion(rank, world, 8, hidden, comm_backend=comm,
                                                                     platform="host")
        assert len(four) == 4 and four[2] == [] and len(two) == 2
        assert sorted(four[1].workspaces) == ["float32"] and sorted(two[1].workspaces) == ["bfloat16", "float16"]
        for made in (four, two):
            fiar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(made[0])
        return outs

    for rank, r in enumerate(harness.run_threads(world, body)):
        assert not isinstance(r, BaseException), f"rank {rank}: {r!r}"
        for name, (res_out, norm) in r.items():
            dtype = np.dtype(name) if name == "float16" else __import__("ml_dtypes").bfloat16
            total = ref.rank_sum([ref.inputs(dtype, tokens, hidden, q) for q in range(world)], np.dtype(dtype))
            y = ref.add_round(total, ref.residual(dtype, tokens, hidden))
            want = {"r": y, "n": ref.rmsnorm(y, ref.weights(dtype, hidden, 1), cases.EPS, 0.0)}
            assert cases.mismatches({"r": res_out, "n": norm}, want) == {"r": 0, "n": 0}, name


def test_flashinfers_workspace_classes():
    """create_allreduce_fusion_workspace returns FlashInfer's class of its backend; the classes' own constructors
    (FlashInfer's signatures) make the same workspaces."""
    class Mapping:  # FlashInfer's Mapping's attributes
        def __init__(self, world_size, rank, gpus_per_node):
            self.world_size, self.rank, self.gpus_per_node, self.tp_size, self.tp_rank = \
                world_size, rank, gpus_per_node, world_size, rank

    def body(rank, comm):
        kinds = []
        for backend in ("trtllm", "mnnvl", "nccl"):
            with fiar.create_allreduce_fusion_workspace(backend, 2, rank, 4, 64, np.float32, comm_backend=comm,
                                                        platform="host") as ws:
                kinds.append((ws.backend, type(ws).__name__, isinstance(ws, fiar.AllReduceFusionWorkspace)))
        with fiar.TRTLLMAllReduceFusionWorkspace(2, rank, 4, 64, np.float32, comm, platform="host") as ws:
            kinds.append((ws.backend, ws.dtype, ws.rank))
        with fiar.MNNVLAllReduceFusionWorkspace(Mapping(2, rank, 2), hidden_dim=64, dtype="bfloat16",
                                                buffer_size_in_bytes=64 * 2 * 8, comm_backend=comm,
                                                platform="host") as ws:
            kinds.append((ws.backend, ws.dtype, ws.is_buffer_size_sufficient(2, 8, 64, "bfloat16"),
                          ws.is_buffer_size_sufficient(2, 9, 64, "bfloat16")))
        return kinds

    for rank, kinds in enumerate(harness.run_threads(2, body)):
        assert kinds == [("trtllm", "TRTLLMAllReduceFusionWorkspace", True),
                         ("mnnvl", "MNNVLAllReduceFusionWorkspace", True), ("nccl", "Workspace", True),
                         ("trtllm", "float32", rank), ("mnnvl", "bfloat16", True, False)], kinds


def test_fiar_mnnvl_imports_before_any_process_group():
    """Engines import flashinfer.comm.mnnvl at module load, before torch.distributed is set up: so does fiar.mnnvl."""
    code = "import fiar.mnnvl, fiar; print(fiar.mnnvl.TorchDistBackend.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["TorchDistBackend"], out.stderr
