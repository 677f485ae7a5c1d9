# SPDX-License-Identifier: Apache-2.0
"""The drop-in promise at the call sites (torch): vLLM's communicator and fusion-pass replacements and FlashInfer's
unified allreduce-fusion loop, restated in dropin_rank_main.py and run with fiar imported in flashinfer.comm's place
(and platform="host"), as processes over torch.distributed gloo; fiar.mnnvl.TorchDistBackend; docs/python.md's
example, run as written."""
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402


# Each mode covers every dtype and both world sizes (W 2 and 4), within CI's time.
CALL_SITES = [("vllm", 2, "bfloat16"), ("vllm", 4, "float16"), ("vllm", 2, "float32"),
              ("flashinfer", 2, "bfloat16"), ("flashinfer", 4, "float16"), ("flashinfer", 2, "float32")]


@pytest.mark.parametrize("mode,world,dtype", CALL_SITES)
def test_call_sites_run_unchanged(mode, world, dtype):
    """dropin_rank_main.py: vLLM's communicator and fusion-pass replacements, or FlashInfer's unified allreduce-fusion
    loop, restated; every output bit for bit against reference.py and within FlashInfer's tolerances."""
    reports = harness.run_processes(world, [mode, dtype], script="dropin_rank_main.py", launcher="torchrun",
                                    timeout=600)
    for report in reports:
        assert report["returncode"] == 0 and report["error"] == "" and report["failures"] == [], report
    if mode == "flashinfer":  # every rank made the same calls; 16-bit runs meet the refused 8x4 NVFP4 calls
        assert len({(r["calls"], r["refused"]) for r in reports}) == 1, reports
        assert reports[0]["calls"] > 0 and (reports[0]["refused"] > 0) == (dtype != "float32"), reports


def test_torch_dist_backend_needs_an_initialised_group():
    import torch.distributed as torch_dist

    import fiar.mnnvl
    if torch_dist.is_initialized():
        pytest.fail("this test process must not have a default process group")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        fiar.mnnvl.TorchDistBackend()


def test_python_md_example_runs_as_written(tmp_path):
    """docs/python.md's drop-in example, as written, as 2 processes with the variables its comment names."""
    for r, (status, out) in enumerate(harness.run_doc_example("docs/python.md", tmp_path, "torchrun")):
        assert status == 0, out
        assert out.split()[-4:] == [str(r), "trtllm", "3.0", "1.0"], out
