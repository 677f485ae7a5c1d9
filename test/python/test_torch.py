# SPDX-License-Identifier: Apache-2.0
"""fiar's torch integration on the host emulator (CPU tensors): the custom op torch.ops.fiar.allreduce_fusion (its
registration checked by torch.library.opcheck), torch.compile(fullgraph=True) against eager, bit for bit against the
numpy reference, and the bootstrap over torch.distributed groups. Skipped as a whole without torch
(test/tools/check_python.py installs it, so CI runs these)."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fiar  # noqa: E402
import cases  # noqa: E402
import harness  # noqa: E402
import reference as ref  # noqa: E402

P = fiar.AllReduceFusionPattern


def _alone(dtype=torch.float16, tokens=8, hidden=256):
    return fiar.create_allreduce_fusion_workspace("auto", 1, 0, tokens, hidden, dtype, platform="host")


def _op_args(ws, pattern, x, **kw):
    """The op's positional arguments for a call on x (fiar's pattern value; kw: the argument dict's tensors)."""
    args = dict(pattern=pattern, strategy=0, input=x, output=None, residual_out=None, norm_out=None, quant_out=None,
                residual_in=None, gamma=None, gamma_pre=None, expanded_idx=None, expert_scale=None,
                shared_expert_out=None, eps=cases.EPS, weight_bias=0.0, layout=0, group_size=cases.GROUP,
                group_scale=0, routed_scaling_factor=1.0)
    args.update(kw)
    return fiar._torch_glue.op_args(ws._id, args)


def test_the_op_is_registered_and_passes_opcheck():
    """Schema, fake implementation, autograd registration and AOT dispatch (dynamic shapes), per kind of call: a
    plain sum, a norm writing two outputs, FP8 reading a scale tensor, NVFP4 writing block scales, the MoE finalize."""
    assert fiar._torch_op is torch.ops.fiar.allreduce_fusion
    schema = str(torch.ops.fiar.allreduce_fusion.default._schema)
    for name in ("output", "residual_out", "norm_out", "quant_out", "scale_out"):
        assert f"Tensor(" in schema and f"!)? {name}" in schema, schema  # written in place, and declared so
    tokens, hidden = 6, 256
    x = torch.from_numpy(ref.inputs(np.float16, tokens, hidden, 0))
    res = torch.from_numpy(ref.residual(np.float16, tokens, hidden))
    g = torch.from_numpy(ref.weights(np.float16, hidden, 1))
    with _alone() as ws:
        rows, idx, scale, shared = (torch.from_numpy(a) for a in ref.moe_inputs(np.float16, tokens, hidden, 0))
        calls = {
            "sum": _op_args(ws, 0, x, output=torch.empty_like(x)),
            "norm": _op_args(ws, 1, x, residual_in=res, residual_out=torch.empty_like(x),
                             norm_out=torch.empty_like(x), gamma=g),
            "fp8": _op_args(ws, 2, x, residual_in=res, residual_out=torch.empty_like(x), gamma=g,
                            quant_out=torch.empty(tokens, hidden, dtype=torch.uint8), scale=torch.full((1,), 0.05)),
            "nvfp4": _op_args(ws, 4, x, residual_in=res, residual_out=torch.empty_like(x), gamma=g,
                              quant_out=torch.empty(tokens, hidden // 2, dtype=torch.uint8), scale=torch.ones(1),
                              block_scale_out=torch.empty(128 * 16, dtype=torch.uint8)),
            "moe": _op_args(ws, 9, rows, output=torch.empty_like(x), expanded_idx=idx, expert_scale=scale,
                            shared_expert_out=shared),
        }
        for name, args in calls.items():
            result = torch.library.opcheck(torch.ops.fiar.allreduce_fusion.default, args)
            assert all(v == "SUCCESS" for v in result.values()), (name, result)


@pytest.mark.parametrize("world", [2, 4])
def test_torch_tensors_bit_exact(world):
    """Every pattern on CPU torch tensors (through the op), ranks as threads, as the numpy reference."""
    dtype, tokens, hidden = np.float16, 7, 256

    def body(rank, comm):
        with fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, torch.float16,
                                                    comm_backend=comm, platform="host", timeout_ms=20000) as ws:
            return cases.wrong_bits(ws, dtype, tokens, hidden, rank, world, tensor=torch.from_numpy)

    for rank, wrong in enumerate(harness.run_threads(world, body)):
        assert not isinstance(wrong, BaseException), f"rank {rank}: {wrong!r}"
        assert len(wrong) == len(cases.PATTERNS) + len(cases.quant_patterns(dtype))
        assert all(n == 0 for w in wrong.values() for n in w.values()), f"rank {rank}: {wrong}"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_fullgraph_equals_eager(backend):
    """A decoder step's shape under torch.compile(fullgraph=True, dynamic=True): an op before, the fused call (the
    residual updated in place, the quantized output allocated in the graph, a float scale_factor), an op after; the
    same bits as eager, the residual written through, one graph for two batch sizes."""
    tokens, hidden = 4, 256
    with _alone(tokens=tokens, hidden=hidden) as ws:
        def step(x, residual, gamma):
            norm = fiar.allreduce_fusion(x * 2, ws, P.kARResidualRMSNormOutFP8Quant, residual_in=residual,
                                         residual_out=residual, rms_gamma=gamma, rms_eps=cases.EPS,
                                         quant_out=torch.empty(x.shape, dtype=torch.uint8), scale_factor=0.5)
            return norm + 1

        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(step, fullgraph=True, backend=backend, dynamic=True)
        g = torch.from_numpy(ref.weights(np.float16, hidden, 1))
        for n in (tokens, tokens - 1):  # a second batch size: the same graph (dynamic shapes)
            x = torch.from_numpy(ref.inputs(np.float16, n, hidden, 0))
            res_eager = torch.from_numpy(ref.residual(np.float16, n, hidden).copy())
            res_compiled = res_eager.clone()
            want = step(x, res_eager, g)
            got = compiled(x, res_compiled, g)
            assert torch.equal(got, want)
            assert torch.equal(res_compiled, res_eager)
            assert not torch.equal(res_eager, torch.from_numpy(ref.residual(np.float16, n, hidden)))
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompilation for the second size


def test_errors_arrive_through_the_op():
    with _alone(dtype=torch.float32, hidden=64) as ws:
        with pytest.raises(TypeError, match="input must be a float32 tensor"):
            fiar.allreduce_fusion(torch.zeros(4, 64, dtype=torch.float16), ws, P.kAllReduce)
        with pytest.raises(ValueError, match="gamma is a null pointer"):
            fiar.allreduce_fusion(torch.zeros(4, 64), ws, P.kARRMSNorm)
    with pytest.raises(RuntimeError, match="destroyed"):
        fiar.allreduce_fusion(torch.zeros(4, 64), ws, P.kAllReduce)


@pytest.mark.parametrize("mode,world,group_size", [("default", 2, 2), ("subgroups", 4, 2)])
def test_torch_distributed_groups(mode, world, group_size):
    """Ranks meet over torch.distributed (gloo): the default group, or each half of the world over its own group
    (group=), whose sums are its own ranks' only; eager and compiled calls bit for bit."""
    reports = harness.run_processes(world, [mode], script="torch_rank_main.py", launcher="torchrun")
    for report in reports:
        assert report["returncode"] == 0 and report["error"] == "", report
        assert report["world"] == group_size, report
        assert all(n == 0 for wrong in report["wrong"].values() for n in wrong.values()), report
        assert len(report["wrong"]) == len(cases.PATTERNS) + len(cases.quant_patterns(np.float16)) + 1
