# SPDX-License-Identifier: Apache-2.0
"""One rank of the drop-in tests: the call sites of an engine (vLLM) and of FlashInfer's own allreduce-fusion test,
restated in our words with their call shapes kept, fiar imported where they import flashinfer.comm, and
platform="host" added where a workspace is made. Ranks are processes over a torch.distributed gloo group (torchrun's
variables); CPU torch tensors. Prints one JSON line: the checks that failed (empty when every one passed).

    dropin_rank_main.py vllm DTYPE         vLLM's communicator and the eight fused replacements of its pass
    dropin_rank_main.py flashinfer DTYPE   FlashInfer's unified loop: every pattern 0-5, every buffer, every layout

Every output is checked bit for bit against reference.py (fiar's numerics restated in numpy: the rank-order sum, the
norm, the FP8 / NVFP4 codes and scales), and the sums and norms also as FlashInfer's tests check them (a torch
reference in float32, their tolerances).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fiar as flashinfer_comm  # noqa: E402  (was: import flashinfer.comm as flashinfer_comm)
from fiar.mnnvl import TorchDistBackend  # noqa: E402  (was: from flashinfer.comm.mnnvl import TorchDistBackend)
import reference as ref  # noqa: E402

MODE, DTYPE = sys.argv[1], getattr(torch, sys.argv[2])
NP_DTYPE = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}[DTYPE]
failures = []


def as_numpy(t):
    """A CPU tensor's values as numpy (bfloat16 as ml_dtypes' type: the same bits)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def raw_bytes(t):
    """A tensor's storage as bytes (for byte outputs fiar writes into a buffer of any element type)."""
    return as_numpy(t).reshape(-1).view(np.uint8)


def gathered(t):
    """Every rank's t, in rank order (numpy)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return [as_numpy(p) for p in parts]


def check_bits(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    bad = int(np.count_nonzero(got.view(np.uint8).reshape(-1) != want.view(np.uint8).reshape(-1)))
    if got.shape != want.shape or bad:
        failures.append(f"{what}: {bad} bytes differ (shape {got.shape} vs {want.shape})")


def check_close(what, got, want, tolerance):
    """FlashInfer's check: float32 values within atol = tolerance, rtol = 1e-2."""
    try:
        torch.testing.assert_close(got.to(torch.float32), want, atol=tolerance, rtol=1e-2)
    except AssertionError as e:
        failures.append(f"{what} (FlashInfer's tolerance): {str(e).splitlines()[0]}")


def expect_reference(what, x, residual, gamma, eps, weight_bias):
    """reference.py's sum, residual sum and norm of this call (x: this rank's input, residual: None for zero)."""
    total = ref.rank_sum(gathered(x), np.dtype(NP_DTYPE))
    y = total if residual is None else ref.add_round(total, as_numpy(residual))
    return total, y, ref.rmsnorm(y, as_numpy(gamma), eps, weight_bias)


# ---------------------------------------------------------------------------------------------------------------------
# vLLM: its FlashInfer all-reduce communicator (flashinfer_all_reduce.py) and the fused op + replacements of its
# AllReduceFusionPass (allreduce_rms_fusion.py), restated.

def vllm_workspace(backend, world_size, rank, max_token_num, hidden_dim, dtype, group):
    """The communicator's workspace creation: a TorchDistBackend over the tensor-parallel group, the group too."""
    comm_backend = TorchDistBackend(group=group)
    return flashinfer_comm.create_allreduce_fusion_workspace(
        backend=backend, world_size=world_size, rank=rank, max_token_num=max_token_num, hidden_dim=hidden_dim,
        dtype=dtype, comm_backend=comm_backend, group=group, platform="host")


def vllm_use_oneshot(backend, world_size, nbytes):
    """vLLM's one-shot choice: None on mnnvl; on trtllm one-shot up to a per-world-size size (sm_100's table)."""
    if backend == "mnnvl":
        return None
    limit_mb = {2: 32, 4: 4, 8: 1}.get(world_size)
    return limit_mb is None or nbytes <= limit_mb * 1024 * 1024


class VllmFusedOp:
    """The pass's custom op: picks the workspace by pattern (quantizing patterns: the trtllm one), then calls
    allreduce_fusion as vLLM does: norm_out None means norm in place (norm_out = allreduce_in, residual_out =
    residual); a norm_out given means the plain sum comes back in allreduce_in (residual_out = allreduce_in, with a
    zero residual)."""

    def __init__(self, workspace, quant_workspace, world_size):
        self.workspace, self.quant_workspace, self.world_size = workspace, quant_workspace, world_size

    def __call__(self, allreduce_in, residual, rms_gamma, rms_eps, pattern_code, norm_out=None, quant_out=None,
                 scale_out=None, scale_factor=None, weight_bias=0.0):
        patterns = flashinfer_comm.AllReduceFusionPattern
        num_tokens, hidden = allreduce_in.shape
        quantizing = pattern_code in (patterns.kARResidualRMSNormFP8Quant, patterns.kARResidualRMSNormFP4Quant)
        workspace = self.quant_workspace if quantizing else self.workspace
        use_oneshot = vllm_use_oneshot(workspace.backend, self.world_size,
                                       num_tokens * hidden * allreduce_in.element_size())
        if norm_out is None:
            norm_out, residual_out = allreduce_in, residual
        else:
            residual_out = allreduce_in
        layout_code = None
        if workspace.backend in ("trtllm", "mnnvl"):
            layout_code = flashinfer_comm.QuantizationSFLayout.SWIZZLED_128x4
        flashinfer_comm.allreduce_fusion(
            input=allreduce_in, workspace=workspace, pattern=pattern_code, launch_with_pdl=True, output=None,
            residual_out=residual_out, norm_out=norm_out, quant_out=quant_out, scale_out=scale_out,
            residual_in=residual, rms_gamma=rms_gamma, rms_eps=rms_eps, scale_factor=scale_factor,
            layout_code=layout_code, use_oneshot=use_oneshot, fp32_acc=True, weight_bias=weight_bias,
            trigger_completion_at_end=(use_oneshot is True) or num_tokens > 16)


def run_vllm(rank, world):
    group = dist.new_group(list(range(world)))  # the tensor-parallel group (a group of its own, not WORLD)
    # FlashInfer's CommBackend calls beyond what a workspace uses: a broadcast from a group rank, a split by color.
    comm = TorchDistBackend(group=group)
    if comm.bcast({"from": rank} if rank == 1 else None, root=1) != {"from": 1}:
        failures.append("TorchDistBackend.bcast did not deliver rank 1's object")
    halves = comm.Split(rank % 2, rank)
    if (halves.Get_size(), halves.Get_rank()) != ((world + 1 - rank % 2) // 2, rank // 2):
        failures.append(f"TorchDistBackend.Split: rank {halves.Get_rank()} of {halves.Get_size()}")
    if halves.allgather(rank) != tuple(r for r in range(world) if r % 2 == rank % 2):
        failures.append("TorchDistBackend.Split: the sub-group holds other ranks")
    hidden, max_tokens, eps = 256, 64, 1e-6
    P = flashinfer_comm.AllReduceFusionPattern
    workspace = vllm_workspace("auto", world, rank, max_tokens, hidden, DTYPE, group)
    quant_workspace = vllm_workspace("trtllm", world, rank, max_tokens, hidden, DTYPE, group)
    op = VllmFusedOp(workspace, quant_workspace, world)
    gen = torch.Generator().manual_seed(11 + rank)
    for tokens in (1, 7, 64):
        def fresh():
            return (torch.randn(tokens, hidden, generator=gen) * 4).to(DTYPE)

        weight = (torch.rand(hidden, generator=gen) + 0.5).to(DTYPE)
        where = f"{tokens} tokens"

        # The communicator's standalone all-reduce: kAllReduce, the output allocated and returned.
        x = fresh()
        out = flashinfer_comm.allreduce_fusion(input=x, workspace=workspace,
                                               pattern=P.kAllReduce, launch_with_pdl=True,
                                               trigger_completion_at_end=tokens > 16)
        check_bits(f"communicator all_reduce, {where}", as_numpy(out), ref.rank_sum(gathered(x), np.dtype(NP_DTYPE)))

        for weight_bias, name in ((0.0, "rmsnorm"), (1.0, "gemma rmsnorm")):
            # Without a residual (first layer): a zero residual, the norm into its own tensor, the sum in input.
            x = fresh()
            total, _, norm = expect_reference(name, x, None, weight, eps, weight_bias)
            residual, rms_result = torch.zeros_like(x), torch.empty_like(x)
            op(x, residual, weight, eps, P.kARResidualRMSNorm, norm_out=rms_result, weight_bias=weight_bias)
            check_bits(f"{name} without residual: norm, {where}", as_numpy(rms_result), norm)
            check_bits(f"{name} without residual: the sum in input, {where}", as_numpy(x), total)
            # With a residual: the norm in place of the input, the new residual in place of the old.
            x, residual = fresh(), fresh()
            total, y, norm = expect_reference(name, x, residual, weight, eps, weight_bias)
            want_sum = torch.from_numpy(np.stack(gathered(x)).astype(np.float32)).sum(0)  # FlashInfer-style
            want_residual = want_sum + residual.float()
            op(x, residual, weight, eps, P.kARResidualRMSNorm, weight_bias=weight_bias)
            check_bits(f"{name} with residual: norm in input, {where}", as_numpy(x), norm)
            check_bits(f"{name} with residual: residual, {where}", as_numpy(residual), y)
            tol = 8e-2 if DTYPE == torch.float16 else 8e-1
            check_close(f"{name} with residual: residual, {where}", residual, want_residual, tol)
            rms = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + eps)
            check_close(f"{name} with residual: norm, {where}", x, (weight_bias + weight.float()) * rms, tol)

        # Static FP8, without and with a residual (norm_out passed to pattern 2, which does not write it).
        scale = torch.tensor([0.05], dtype=torch.float32)
        x = fresh()
        total, _, norm = expect_reference("fp8", x, None, weight, eps, 0.0)
        residual, result_rms = torch.zeros_like(x), torch.empty_like(x)
        result_quant = torch.empty_like(x, dtype=torch.float8_e4m3fn)
        op(x, residual, weight, eps, P.kARResidualRMSNormFP8Quant, norm_out=result_rms, quant_out=result_quant,
           scale_factor=scale)
        check_bits(f"static fp8 without residual: codes, {where}", as_numpy(result_quant), ref.fp8_static(norm, 0.05))
        check_bits(f"static fp8 without residual: the sum in input, {where}", as_numpy(x), total)
        x, residual = fresh(), fresh()
        _, y, norm = expect_reference("fp8", x, residual, weight, eps, 0.0)
        result_quant = torch.empty_like(x, dtype=torch.float8_e4m3fn)
        op(x, residual, weight, eps, P.kARResidualRMSNormFP8Quant, quant_out=result_quant, scale_factor=scale)
        check_bits(f"static fp8 with residual: codes, {where}", as_numpy(result_quant), ref.fp8_static(norm, 0.05))
        check_bits(f"static fp8 with residual: residual, {where}", as_numpy(residual), y)

        if DTYPE == torch.float32:
            continue  # NVFP4 takes 16-bit input (vLLM registers it for 16-bit models)
        # Static NVFP4 with swizzled scales: vLLM's int32 scale buffer, viewed as FP8 for the call.
        global_scale = torch.tensor([[3.0]], dtype=torch.float32)
        rows, cols = (tokens + 127) // 128 * 128, (hidden // 16 + 3) // 4 * 4
        for with_residual in (False, True):
            x = fresh()
            residual = fresh() if with_residual else torch.zeros_like(x)
            total, y, norm = expect_reference("nvfp4", x, residual if with_residual else None, weight, eps, 0.0)
            quant_result = torch.empty((tokens, hidden // 2), dtype=torch.uint8)
            output_scale = torch.full((rows, cols // 4), -1, dtype=torch.int32)
            kw = {} if with_residual else {"norm_out": torch.empty_like(x)}
            op(x, residual, weight, eps, P.kARResidualRMSNormFP4Quant, quant_out=quant_result,
               scale_out=output_scale.view(torch.float8_e4m3fn), scale_factor=global_scale, **kw)
            codes, scales = ref.nvfp4(norm, 3.0, True)
            label = "with" if with_residual else "without"
            check_bits(f"nvfp4 {label} residual: codes, {where}", as_numpy(quant_result), codes)
            check_bits(f"nvfp4 {label} residual: scales, {where}", raw_bytes(output_scale), scales)
            check_bits(f"nvfp4 {label} residual: " + ("residual" if with_residual else "the sum in input") +
                       f", {where}", as_numpy(residual if with_residual else x), y if with_residual else total)
    workspace.destroy()
    quant_workspace.destroy()


# ---------------------------------------------------------------------------------------------------------------------
# FlashInfer's tests/comm/test_trtllm_allreduce_fusion.py with the unified API, restated: every pattern 0-5, every
# scale layout, every use_oneshot / launch_with_pdl / trigger_completion_at_end / fp32_acc, every buffer passed to every
# call, as that test allocates them (quant_out and scale_out of the activations' dtype).

def run_flashinfer(rank, world):
    comm = flashinfer_comm
    # FlashInfer's loop runs 1, 128, 1024 and 2048 tokens of 1024 to 8192 elements, each call 5 times, then captured;
    # here 1, 16 and (at 2 ranks) 128 tokens of 1024, each call once (the host emulator: CI's two cores).
    hidden, max_tokens = 1024, 128
    workspace = comm.create_allreduce_fusion_workspace(backend="trtllm", world_size=world, rank=rank,
                                                       max_token_num=max_tokens, hidden_dim=hidden, dtype=DTYPE,
                                                       comm_backend=TorchDistBackend(), platform="host")
    P, L = comm.AllReduceFusionPattern, comm.QuantizationSFLayout
    patterns = [P.kAllReduce, P.kARResidualRMSNorm, P.kARResidualRMSNormFP8Quant, P.kARResidualRMSNormFP4Quant,
                P.kARResidualRMSNormOutFP8Quant, P.kARResidualRMSNormOutFP4Quant]
    fp4 = (P.kARResidualRMSNormFP4Quant, P.kARResidualRMSNormOutFP4Quant)
    gen = torch.Generator().manual_seed(42 + rank)
    calls = refused = 0
    flags = 0  # launch_with_pdl, trigger_completion_at_end and fp32_acc change nothing in fiar: one combination a call
    for tokens in (1, 16, 128) if world == 2 else (1, 16):
        for pattern in patterns:
            for layout in (L.LINEAR, L.SWIZZLED_128x4, L.SWIZZLED_8x4):
                for use_oneshot in (True, False, None):
                    if tokens < world and not use_oneshot:
                        continue  # as FlashInfer's loop
                    if DTYPE == torch.float32 and pattern in fp4:
                        continue  # as FlashInfer's loop: NVFP4 takes 16-bit input
                    flags += 1
                    pdl, trigger, fp32_acc = bool(flags & 1), bool(flags & 2), bool(flags & 4)
                    weight_bias = float(tokens == 16)
                    where = f"pattern {pattern}, layout {layout}, use_oneshot {use_oneshot}, {tokens} tokens"
                    size = tokens * hidden
                    allreduce_in = torch.randn(size, dtype=DTYPE, generator=gen)
                    all_reduce_out = torch.zeros(size, dtype=DTYPE)
                    residual_in = torch.randn(size, dtype=DTYPE, generator=gen)
                    residual_out, norm_out = torch.empty_like(residual_in), torch.empty_like(residual_in)
                    quant_out = torch.empty(size, dtype=DTYPE)
                    if layout == L.SWIZZLED_128x4:
                        scale_out = torch.empty((tokens + 127) // 128 * 128 * ((hidden + 63) // 64 * 4), dtype=DTYPE)
                    else:
                        scale_out = torch.empty(size // 16, dtype=DTYPE)
                    rms_gamma = torch.randn(hidden, dtype=DTYPE, generator=gen)
                    scale_factor = torch.rand(1, dtype=torch.float32, generator=gen) * 2 - 1
                    rms_eps = 1e-3

                    def call():
                        comm.allreduce_fusion(
                            input=allreduce_in.view(tokens, hidden), workspace=workspace, launch_with_pdl=pdl,
                            output=all_reduce_out.view(tokens, hidden), residual_in=residual_in.view(tokens, hidden),
                            residual_out=residual_out.view(tokens, hidden), norm_out=norm_out.view(tokens, hidden),
                            quant_out=quant_out.view(tokens, hidden), scale_out=scale_out, rms_gamma=rms_gamma,
                            rms_eps=rms_eps, weight_bias=weight_bias, scale_factor=scale_factor, layout_code=layout,
                            pattern=pattern, use_oneshot=use_oneshot, fp32_acc=fp32_acc,
                            trigger_completion_at_end=trigger)

                    if pattern in fp4 and layout == L.SWIZZLED_8x4:
                        # fiar refuses the 8x4 swizzle before anything runs (FlashInfer's fusion kernels write no
                        # scales for it): the same on every rank, so no rank waits for another.
                        try:
                            call()
                            failures.append(f"{where}: the 8x4 layout was not refused")
                        except ValueError as e:
                            if "SWIZZLED_128x4" not in str(e):
                                failures.append(f"{where}: {e}")
                        refused += 1
                        continue
                    call()
                    calls += 1
                    x = allreduce_in.view(tokens, hidden)
                    total, y, norm = expect_reference(where, x, residual_in.view(tokens, hidden), rms_gamma, rms_eps,
                                                      weight_bias)
                    # FlashInfer's reference: the all-reduce in float32, the residual add and the norm after it.
                    want_sum = torch.from_numpy(np.stack(gathered(x)).astype(np.float32)).sum(0)
                    want_residual = want_sum + residual_in.view(tokens, hidden).float()
                    rms = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + rms_eps)
                    tol = 8e-2 if DTYPE == torch.float16 else 8e-1
                    if pattern == P.kAllReduce:
                        check_bits(f"{where}: output", as_numpy(all_reduce_out.view(tokens, hidden)), total)
                        check_close(f"{where}: output", all_reduce_out.view(tokens, hidden), want_sum, tol)
                        continue
                    check_bits(f"{where}: residual_out", as_numpy(residual_out.view(tokens, hidden)), y)
                    check_close(f"{where}: residual_out", residual_out.view(tokens, hidden), want_residual, tol)
                    if pattern in (P.kARResidualRMSNorm, P.kARResidualRMSNormOutFP8Quant,
                                   P.kARResidualRMSNormOutFP4Quant):
                        check_bits(f"{where}: norm_out", as_numpy(norm_out.view(tokens, hidden)), norm)
                        check_close(f"{where}: norm_out", norm_out.view(tokens, hidden),
                                    (weight_bias + rms_gamma.float()) * rms, tol)
                    quant = raw_bytes(quant_out)
                    if pattern in (P.kARResidualRMSNormFP8Quant, P.kARResidualRMSNormOutFP8Quant):
                        check_bits(f"{where}: quant_out", quant[:size],
                                   ref.fp8_static(norm, float(scale_factor[0])).reshape(-1))
                    elif pattern in fp4:
                        codes, scales = ref.nvfp4(norm, float(scale_factor[0]), layout == L.SWIZZLED_128x4)
                        check_bits(f"{where}: quant_out", quant[:size // 2], codes.reshape(-1))
                        check_bits(f"{where}: scale_out", raw_bytes(scale_out)[:scales.size], scales)
    workspace.destroy()
    return {"calls": calls, "refused": refused}


report = {"rank": int(os.environ["RANK"]), "failures": failures, "error": ""}
try:
    dist.init_process_group("gloo")
    if MODE == "vllm":
        run_vllm(dist.get_rank(), dist.get_world_size())
    else:
        report.update(run_flashinfer(dist.get_rank(), dist.get_world_size()))
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - reported to the test
    import traceback
    report["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
report["failures"] = failures[:20] + ([f"... {len(failures) - 20} more"] if len(failures) > 20 else [])
print(json.dumps(report))
sys.exit(0 if not report["error"] and not failures else 1)
