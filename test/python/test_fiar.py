# SPDX-License-Identifier: Apache-2.0
"""fiar's Python package on the host emulator: flashinfer.comm's names, codes and signature; every pattern the numpy
reference covers, bit for bit, with ranks as threads and as processes; the errors a caller can get."""
import inspect
import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fiar  # noqa: E402
import cases  # noqa: E402
import harness  # noqa: E402
import reference as ref  # noqa: E402

P = fiar.AllReduceFusionPattern
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# FlashInfer's allreduce_fusion (flashinfer/comm/allreduce.py), in order, with its defaults; then fiar's keyword-only
# parameters. Frozen here: a change on either side shows.
FLASHINFER_ALLREDUCE_FUSION = [
    ("input", inspect.Parameter.empty), ("workspace", inspect.Parameter.empty), ("pattern", inspect.Parameter.empty),
    ("launch_with_pdl", False), ("trigger_completion_at_end", True), ("output", None), ("residual_out", None),
    ("norm_out", None), ("quant_out", None), ("scale_out", None), ("residual_in", None), ("rms_gamma", None),
    ("rms_eps", 1e-6), ("scale_factor", None), ("layout_code", None), ("use_oneshot", None), ("fp32_acc", False),
    ("moe_reduction_device_num_experts", None), ("moe_reduction_scale_input", None),
    ("moe_reduction_active_experts_token_input", None), ("moe_reduction_token_input", None),
    ("expanded_idx_to_permuted_idx", None), ("expert_scale_factor", None), ("shared_expert_output", None),
    ("block_quant_group_size", None), ("weight_bias", 0.0),
]
FIAR_KEYWORD_ONLY = [("moe_finalize_backend", None), ("gamma_pre", None), ("routed_scaling_factor", 1.0),
                     ("strategy", None), ("strict", False)]
FLASHINFER_CREATE = [("backend", "auto"), ("world_size", None), ("rank", None), ("max_token_num", None),
                     ("hidden_dim", None), ("dtype", None), ("gpus_per_node", None), ("comm_backend", None),
                     ("force_oneshot_support", False), ("group", None)]
FIAR_CREATE_KEYWORD_ONLY = [("platform", "cuda"), ("timeout_ms", 30000), ("batch_invariant", False)]
E = inspect.Parameter.empty
# FlashInfer's legacy trtllm entry points (flashinfer/comm/trtllm_ar.py) and its workspace classes' constructors
# (allreduce.py, trtllm_mnnvl_ar.py), each: (positional parameters with defaults, fiar's keyword-only ones).
FLASHINFER_LEGACY = {
    "trtllm_create_ipc_workspace_for_all_reduce_fusion": (
        [("tp_rank", E), ("tp_size", E), ("max_token_num", E), ("hidden_dim", E), ("use_fp32_lamport", False),
         ("group", None), ("create_metadata", False), ("comm_backend", None), ("use_symm_dev_mem", False)],
        FIAR_CREATE_KEYWORD_ONLY),
    "trtllm_destroy_ipc_workspace_for_all_reduce_fusion": ([("workspace", E), ("group", None)], []),
    "trtllm_allreduce_fusion": (
        [("allreduce_in", E), ("world_size", E), ("world_rank", E), ("token_num", E), ("hidden_dim", E),
         ("workspace_ptrs", E), ("launch_with_pdl", E), ("trigger_completion_at_end", E), ("fp32_acc", E),
         ("pattern_code", E), ("use_oneshot", E), ("allreduce_out", E), ("residual_in", E), ("residual_out", E),
         ("norm_out", E), ("quant_out", E), ("scale_out", E), ("rms_gamma", E), ("rms_eps", E), ("scale_factor", E),
         ("layout_code", E), ("metadata", None), ("block_quant_group_size", None), ("weight_bias", None)],
        [("strict", False)]),
    "TRTLLMAllReduceFusionWorkspace": (
        [("tp_size", E), ("tp_rank", E), ("max_token_num", E), ("hidden_dim", E), ("dtype", "float16"),
         ("comm_backend", None), ("group", None)], FIAR_CREATE_KEYWORD_ONLY),
    "MNNVLAllReduceFusionWorkspace": (
        [("mapping", E), ("max_num_tokens", None), ("hidden_dim", None), ("dtype", None),
         ("buffer_size_in_bytes", None), ("comm_backend", None)], FIAR_CREATE_KEYWORD_ONLY),
}


def test_version_is_the_libraries():
    version = re.search(r'^version = "([^"]+)"', open(os.path.join(ROOT, "pyproject.toml")).read(), re.M).group(1)
    assert fiar.__version__ == version


def test_signatures_are_flashinfers():
    params = list(inspect.signature(fiar.allreduce_fusion).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    keyword_only = [(p.name, p.default) for p in params if p.kind == p.KEYWORD_ONLY]
    assert positional == FLASHINFER_ALLREDUCE_FUSION
    assert keyword_only == FIAR_KEYWORD_ONLY
    params = list(inspect.signature(fiar.create_allreduce_fusion_workspace).parameters.values())
    assert [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD] == FLASHINFER_CREATE
    assert [(p.name, p.default) for p in params if p.kind == p.KEYWORD_ONLY] == FIAR_CREATE_KEYWORD_ONLY


@pytest.mark.parametrize("name", sorted(FLASHINFER_LEGACY))
def test_legacy_signatures_are_flashinfers(name):
    params = list(inspect.signature(getattr(fiar, name)).parameters.values())
    positional, keyword_only = FLASHINFER_LEGACY[name]
    assert [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD] == positional
    assert [(p.name, p.default) for p in params if p.kind == p.KEYWORD_ONLY] == keyword_only


def test_flashinfers_names_are_there():
    """What engines and FlashInfer's tests import from flashinfer.comm and flashinfer.comm.mnnvl."""
    import fiar.mnnvl
    assert fiar.AllReduceFusionWorkspace is fiar.Workspace
    assert issubclass(fiar.TRTLLMAllReduceFusionWorkspace, fiar.AllReduceFusionWorkspace)
    assert issubclass(fiar.MNNVLAllReduceFusionWorkspace, fiar.AllReduceFusionWorkspace)
    assert fiar.mnnvl.MNNVLAllReduceFusionWorkspace is fiar.MNNVLAllReduceFusionWorkspace
    assert [m for m in ("Get_rank", "Get_size", "allgather", "bcast", "barrier", "Split")
            if not callable(getattr(fiar.mnnvl.TorchDistBackend, m, None))] == []
    assert isinstance(harness.ThreadComm({}, 0, 1), fiar.mnnvl.CommBackend) is False  # no bcast / Split: not one


def test_codes_are_flashinfers():
    codes = {n: v for n, v in vars(P).items() if n.startswith("k")}
    assert [codes[n] for n in ("kAllReduce", "kARResidualRMSNorm", "kARResidualRMSNormFP8Quant",
                               "kARResidualRMSNormFP4Quant", "kARResidualRMSNormOutFP8Quant",
                               "kARResidualRMSNormOutFP4Quant", "kMoEReductionARResidualRMSNorm",
                               "kMoEFinalizeARResidualRMSNorm", "kARResidualRMSNormPerTokenGroupFP8PackedQuant",
                               "kARResidualRMSNormOutPerTokenGroupFP8PackedQuant",
                               "kARResidualRMSNormDynamicFP8Quant", "kARResidualRMSNormOutDynamicFP8Quant")] == \
        list(range(12))
    assert all(v >= 100 for n, v in codes.items() if n in ("kARRMSNorm", "kARResidualRMSNormPrePost",
                                                           "kMoEFinalizeAllReduce"))
    assert len(set(codes.values())) == len(codes)
    assert (fiar.QuantizationSFLayout.SWIZZLED_128x4, fiar.QuantizationSFLayout.LINEAR) == (0, 2)
    assert issubclass(fiar.TimeoutError, TimeoutError)


def _one_rank(**kw):
    args = dict(backend="trtllm", world_size=1, rank=0, max_token_num=8, hidden_dim=64, dtype=np.float32,
                comm_backend=harness.ThreadComm({"slots": [None], "barrier": __import__("threading").Barrier(1)},
                                                0, 1), platform="host")
    args.update(kw)
    return fiar.create_allreduce_fusion_workspace(**args)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("tokens", [1, 7, 128])
@pytest.mark.parametrize("pattern", list(cases.PATTERNS))
@pytest.mark.parametrize("world", [2, 4])
def test_threads_bit_exact(world, pattern, tokens, dtype):
    hidden = 256

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            return cases.call_rank(ws, pattern, dtype, tokens, hidden, rank)

    results = harness.run_threads(world, body)
    want = cases.expected(pattern, dtype, tokens, hidden, world)
    for rank, got in enumerate(results):
        assert not isinstance(got, BaseException), f"rank {rank}: {got!r}"
        assert cases.mismatches(got, want) == {name: 0 for name in want}, f"rank {rank}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("tokens", [1, 7, 128])
@pytest.mark.parametrize("world", [2, 4])
def test_quantized_patterns_bit_exact(world, tokens, dtype):
    """Every quantizing pattern: codes and scale bytes (the padding included) as the numpy reference's, and the
    residual and norm outputs too."""
    hidden = 256

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            return {p: cases.call_quant(ws, p, dtype, tokens, hidden, rank) for p in cases.quant_patterns(dtype)}

    results = harness.run_threads(world, body)
    for p in cases.quant_patterns(dtype):
        want = cases.expected_quant(p, dtype, tokens, hidden, world)
        for rank, got in enumerate(results):
            assert not isinstance(got, BaseException), f"rank {rank}: {got!r}"
            assert cases.mismatches(got[p], want) == {name: 0 for name in want}, f"rank {rank} pattern {p}"


@pytest.mark.parametrize("tokens", [1, 7, 128])
@pytest.mark.parametrize("world", [2, 4])
def test_bfloat16_numpy_arrays_bit_exact(world, tokens):
    """bfloat16 as ml_dtypes' numpy arrays (numpy's DLPack has no bfloat16: they travel as uint16 views, relabelled):
    every pattern, the quantizing ones too, as the reference computes them in bfloat16."""
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    hidden = 256

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, bf16, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            return cases.wrong_bits(ws, bf16, tokens, hidden, rank, world)

    for rank, wrong in enumerate(harness.run_threads(world, body)):
        assert not isinstance(wrong, BaseException), f"rank {rank}: {wrong!r}"
        assert len(wrong) == len(cases.PATTERNS) + len(cases.QUANT)
        assert all(n == 0 for w in wrong.values() for n in w.values()), f"rank {rank}: {wrong}"
    with pytest.raises(TypeError, match="input must be a bfloat16 tensor"):  # plain uint16 is not bfloat16
        with _one_rank(dtype=bf16) as ws:
            fiar.allreduce_fusion(np.zeros((4, 64), np.uint16), ws, P.kAllReduce)


@pytest.mark.parametrize("dtype,hidden", [(np.float16, 8 * 32 * 33), (np.float32, 4 * 32 * 33)])
def test_long_rows_bit_exact(dtype, hidden):
    """1056 vectors a row: 33 chunks of the canonical sum, so its partials wrap (chunk 32 adds into partial 0)."""
    world, tokens = 2, 2

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            return {p: cases.call_rank(ws, p, dtype, tokens, hidden, rank)
                    for p in (P.kARRMSNorm, P.kARResidualRMSNorm)}

    for rank, got in enumerate(harness.run_threads(world, body)):
        assert not isinstance(got, BaseException), f"rank {rank}: {got!r}"
        for p, outs in got.items():
            want = cases.expected(p, dtype, tokens, hidden, world)
            assert cases.mismatches(outs, want) == {name: 0 for name in want}, f"rank {rank} pattern {p}"


@pytest.mark.parametrize("backend,strategy", [("trtllm", "oneshot"), ("trtllm", "twoshot"), ("mnnvl", "multimem"),
                                              ("nccl", None)])
def test_every_backend_and_strategy(backend, strategy):
    world, tokens, hidden, dtype = 3, 5, 128, np.float16

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace(backend, world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host", timeout_ms=20000) as ws:
            out = {p: cases.call_rank(ws, p, dtype, tokens, hidden, rank, strategy=strategy) for p in cases.PATTERNS}
            return out, ws.backend, ws.last_strategy

    for rank, r in enumerate(harness.run_threads(world, body)):
        assert not isinstance(r, BaseException), f"rank {rank}: {r!r}"
        got, ran_backend, ran = r
        assert ran_backend == backend and ran == (strategy or "auto")
        for p, outs in got.items():
            want = cases.expected(p, dtype, tokens, hidden, world)
            assert cases.mismatches(outs, want) == {name: 0 for name in want}, f"rank {rank} pattern {p}"


@pytest.mark.parametrize("world", [2, 4])
def test_processes_over_tcp(world):
    reports = harness.run_processes(world, ["float16", "7", "256"])
    for r, report in enumerate(reports):
        assert report["returncode"] == 0 and report["error"] == "", report
        assert all(n == 0 for wrong in report["wrong"].values() for n in wrong.values()), report
        assert len(report["wrong"]) == len(cases.PATTERNS) + len(cases.quant_patterns(np.float16))


def test_bad_arguments_name_themselves():
    ws = _one_rank()
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(TypeError, match="dtype"):
        _one_rank(dtype="int8")
    with pytest.raises(ValueError, match="max_token_num is required"):
        _one_rank(max_token_num=None)
    if not fiar._fiar.cuda:  # an emulator-only build refuses the GPU platform up front
        with pytest.raises(ValueError, match="platform 'cuda'"):
            _one_rank(platform="cuda")
    with pytest.raises(TypeError, match="input must be a float32 tensor"):
        fiar.allreduce_fusion(np.zeros((4, 64), np.float16), ws, P.kAllReduce)
    with pytest.raises(ValueError, match=r"residual_in has shape \(3, 64\); expected \(4, 64\)"):
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNorm, residual_in=np.zeros((3, 64), np.float32),
                              rms_gamma=np.ones(64, np.float32))
    with pytest.raises(ValueError, match="norm_out must be contiguous"):
        fiar.allreduce_fusion(x, ws, P.kARRMSNorm, norm_out=np.zeros((4, 128), np.float32)[:, ::2],
                              rms_gamma=np.ones(64, np.float32))
    with pytest.raises(ValueError, match="pattern 6"):
        fiar.allreduce_fusion(x, ws, P.kMoEReductionARResidualRMSNorm)
    with pytest.raises(ValueError, match="gamma is a null pointer"):  # fiar's own check, fiar's message
        fiar.allreduce_fusion(x, ws, P.kARRMSNorm)
    with pytest.raises(ValueError, match="num_tokens = 9; allowed: 1 to max_token_num = 8"):
        fiar.allreduce_fusion(np.zeros((9, 64), np.float32), ws, P.kAllReduce)
    with pytest.raises(ValueError, match="strategy 'fast'"):
        fiar.allreduce_fusion(x, ws, P.kAllReduce, strategy="fast")
    assert ws.is_buffer_size_sufficient(1, 8, 64, np.float32) and not ws.is_buffer_size_sufficient(1, 9, 64, "float32")
    assert not ws.is_buffer_size_sufficient(2, 8, 64, np.float32)
    out = fiar.allreduce_fusion(x + 1, ws, P.kAllReduce)  # still usable after the rejected calls
    assert (out == 1).all()
    ws.destroy()
    ws.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        fiar.allreduce_fusion(x, ws, P.kAllReduce)


def test_a_rank_that_never_calls_times_out():
    def body(rank, comm):
        ws = fiar.create_allreduce_fusion_workspace("trtllm", 2, rank, 4, 64, np.float32, comm_backend=comm,
                                                    platform="host", timeout_ms=1000)
        if rank == 1:
            return "stayed away"
        with pytest.raises(fiar.TimeoutError, match="gave up after 1000 ms waiting for data from rank"):
            fiar.allreduce_fusion(np.ones((2, 64), np.float32), ws, P.kAllReduce)
        return "timed out"

    assert harness.run_threads(2, body) == ["timed out", "stayed away"]


def test_differing_calls_raise_mismatch():
    def body(rank, comm):
        ws = fiar.create_allreduce_fusion_workspace("trtllm", 2, rank, 4, 64, np.float32, comm_backend=comm,
                                                    platform="host", timeout_ms=20000)
        with pytest.raises(fiar.MismatchError, match="num_tokens 2.*num_tokens 3|num_tokens 3.*num_tokens 2"):
            fiar.allreduce_fusion(np.ones((2 + rank, 64), np.float32), ws, P.kAllReduce)
        return "ok"

    assert harness.run_threads(2, body) == ["ok", "ok"]


def test_readme_example_runs_as_written(tmp_path):
    """The README's Python block, as written, as 2 processes (its own comment says how to run it)."""
    for r, (status, out) in enumerate(harness.run_doc_example("README.md", tmp_path, "fiar", timeout=120)):
        assert status == 0, out
        assert out.split() == [str(r), "mnnvl", "4.0", "1.0"], out


def test_missing_outputs_are_allocated():
    """Like FlashInfer: output, norm_out and residual_out are made when not given (a MoE output has a row per token,
    not per permuted row), and the call returns norm_out, else output."""
    world, tokens, hidden, dtype = 2, 5, 64, np.float32

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("trtllm", world, rank, tokens, hidden, dtype, comm_backend=comm,
                                                    platform="host") as ws:
            rows, idx, scale, shared = ref.moe_inputs(dtype, tokens, hidden, rank)
            moe = fiar.allreduce_fusion(rows, ws, P.kMoEFinalizeAllReduce, expanded_idx_to_permuted_idx=idx,
                                        expert_scale_factor=scale, shared_expert_output=shared,
                                        routed_scaling_factor=cases.RSF)
            norm = fiar.allreduce_fusion(ref.inputs(dtype, tokens, hidden, rank), ws, P.kARResidualRMSNorm,
                                         residual_in=ref.residual(dtype, tokens, hidden),
                                         rms_gamma=ref.weights(dtype, hidden, 1), rms_eps=cases.EPS)
            return moe, norm

    for rank, r in enumerate(harness.run_threads(world, body)):
        assert not isinstance(r, BaseException), f"rank {rank}: {r!r}"
        moe, norm = r
        assert moe.shape == (tokens, hidden) and norm.shape == (tokens, hidden)
        assert cases.mismatches({"output": moe}, cases.expected(P.kMoEFinalizeAllReduce, dtype, tokens, hidden,
                                                                 world)) == {"output": 0}
        want = cases.expected(P.kARResidualRMSNorm, dtype, tokens, hidden, world)["norm_out"]
        assert cases.mismatches({"norm_out": norm}, {"norm_out": want}) == {"norm_out": 0}


def test_a_group_of_one_needs_no_rendezvous():
    """world_size 1 without comm_backend: no TCP bootstrap (no launcher variables needed); the sum is the input."""
    with fiar.create_allreduce_fusion_workspace("auto", 1, 0, 4, 64, np.float32, platform="host") as ws:
        x = ref.inputs(np.float32, 3, 64, 0)
        assert ws.platform == "host" and ws.world_size == 1
        assert (fiar.allreduce_fusion(x, ws, P.kAllReduce) == x).all()


def test_tensors_too_small_for_what_fiar_writes_are_refused():
    """fiar writes quantized codes and block scales by pointer: a tensor smaller than its layout is refused first."""
    ws = _one_rank(dtype=np.float16, max_token_num=4)
    x = np.zeros((4, 64), np.float16)
    norm = dict(residual_in=np.zeros_like(x), residual_out=np.zeros_like(x), rms_gamma=np.ones(64, np.float16))
    with pytest.raises(ValueError, match=r"rms_gamma has shape \(32\); expected \(64\)"):
        fiar.allreduce_fusion(x, ws, P.kARRMSNorm, rms_gamma=np.ones(32, np.float16))
    with pytest.raises(ValueError, match=r"quant_out has shape \(4, 64\); expected \(4, 32\)"):  # NVFP4: 2 a byte
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP4Quant, quant_out=np.zeros((4, 64), np.uint8),
                              scale_out=np.zeros(512, np.uint8), scale_factor=1.0, strict=True, **norm)
    with pytest.raises(ValueError, match="quant_out holds 127 bytes; this call's quantized codes take 128"):
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP4Quant, quant_out=np.zeros(127, np.uint8),
                              scale_out=np.zeros(512, np.uint8), scale_factor=1.0, **norm)
    for strict in (False, True):
        with pytest.raises(ValueError, match="scale_out holds 511 bytes; this call's block scales .*take 512"):
            fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormFP4Quant, quant_out=np.zeros((4, 32), np.uint8),
                                  scale_out=np.zeros(511, np.uint8), scale_factor=1.0, strict=strict, **norm)
    with pytest.raises(ValueError, match=r"scale_out must have shape \(4, 1\) and strides \(1, 4\)"):
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                              quant_out=np.zeros((4, 64), np.uint8), scale_out=np.zeros((4, 2), np.int32),
                              block_quant_group_size=32, **norm)
    with pytest.raises(TypeError, match="scale_out must be an int32 tensor"):
        fiar.allreduce_fusion(x, ws, P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                              quant_out=np.zeros((4, 64), np.uint8), scale_out=np.zeros((4, 1), np.float32),
                              block_quant_group_size=32, **norm)
    ws.destroy()
