# SPDX-License-Identifier: Apache-2.0
"""fiar's Python package on a GPU (platform="cuda", torch CUDA tensors): every pattern of the numpy reference bit for
bit, ranks as threads of one process sharing the GPU; a call captured in a CUDA graph and replayed on new inputs; the
compiled call. Skipped without a CUDA build of fiar, torch or a GPU (CI has none: scripts/gpu-check runs these)."""
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
if not (fiar._fiar.cuda and torch.cuda.is_available()):
    pytest.skip("needs a CUDA build of fiar (FIAR_PYTHON_CUDA=1) and a GPU visible to torch", allow_module_level=True)


def on_gpu(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@pytest.mark.parametrize("world", [1, 2])
def test_every_pattern_bit_exact(world):
    dtype, tokens, hidden = np.float16, 7, 256

    def body(rank, comm):
        torch.cuda.set_device(0)  # the ranks share the machine's first GPU
        # Each rank thread on a stream of its own (torch's current stream is per thread): on one shared stream one
        # rank's kernel would wait for its peer's, queued behind it, until the timeout.
        with torch.cuda.stream(torch.cuda.Stream()), \
                fiar.create_allreduce_fusion_workspace("auto", world, rank, tokens, hidden, torch.float16,
                                                       comm_backend=comm, platform="cuda", timeout_ms=20000) as ws:
            out = {p: cases.call_rank(ws, p, dtype, tokens, hidden, rank, tensor=on_gpu) for p in cases.PATTERNS}
            torch.cuda.synchronize()
            ws.check()
            return out, ws.backend

    for rank, r in enumerate(harness.run_threads(world, body)):
        assert not isinstance(r, BaseException), f"rank {rank}: {r!r}"
        got, backend = r
        for p, outs in got.items():
            want = cases.expected(p, dtype, tokens, hidden, world)
            assert cases.mismatches(outs, want) == {name: 0 for name in want}, f"rank {rank} pattern {p} ({backend})"


def test_cuda_graph_capture_and_replay():
    """The call captured on torch's capturing stream (the workspace made before), replayed on new inputs."""
    tokens, hidden = 4, 256
    with fiar.create_allreduce_fusion_workspace("auto", 1, 0, tokens, hidden, torch.float16, platform="cuda") as ws:
        x = torch.empty(tokens, hidden, dtype=torch.float16, device="cuda")
        residual = torch.empty_like(x)
        norm = torch.empty_like(x)
        gamma = on_gpu(ref.weights(np.float16, hidden, 1))
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):  # warm up off the default stream, as torch asks before capture
            fiar.allreduce_fusion(x.zero_(), ws, P.kARResidualRMSNorm, residual_in=residual.zero_(),
                                  residual_out=residual, norm_out=norm, rms_gamma=gamma, rms_eps=cases.EPS)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fiar.allreduce_fusion(x, ws, P.kARResidualRMSNorm, residual_in=residual, residual_out=residual,
                                  norm_out=norm, rms_gamma=gamma, rms_eps=cases.EPS)
        x.copy_(on_gpu(ref.inputs(np.float16, tokens, hidden, 0)))
        residual.copy_(on_gpu(ref.residual(np.float16, tokens, hidden)))
        graph.replay()
        torch.cuda.synchronize()
        want = cases.expected(P.kARResidualRMSNorm, np.float16, tokens, hidden, 1)
        got = {"residual_out": residual.cpu().numpy(), "norm_out": norm.cpu().numpy()}
        assert cases.mismatches(got, want) == {"residual_out": 0, "norm_out": 0}
        ws.check()


def test_compiled_call_on_the_gpu():
    tokens, hidden = 4, 256
    with fiar.create_allreduce_fusion_workspace("auto", 1, 0, tokens, hidden, torch.float16, platform="cuda") as ws:
        def step(x, residual, gamma):
            return fiar.allreduce_fusion(x, ws, P.kARResidualRMSNorm, residual_in=residual, residual_out=residual,
                                         rms_gamma=gamma, rms_eps=cases.EPS)

        x = on_gpu(ref.inputs(np.float16, tokens, hidden, 0))
        residual = on_gpu(ref.residual(np.float16, tokens, hidden))
        norm = torch.compile(step, fullgraph=True)(x, residual, on_gpu(ref.weights(np.float16, hidden, 1)))
        want = cases.expected(P.kARResidualRMSNorm, np.float16, tokens, hidden, 1)
        got = {"residual_out": residual.cpu().numpy(), "norm_out": norm.cpu().numpy()}
        assert cases.mismatches(got, want) == {"residual_out": 0, "norm_out": 0}
