# SPDX-License-Identifier: Apache-2.0
"""fiar: fused all-reduce for tensor-parallel LLM inference, with flashinfer.comm's names and codes.

An engine that calls ``flashinfer.comm.create_allreduce_fusion_workspace`` and ``allreduce_fusion`` switches by
changing the import::

    import fiar as comm          # was: import flashinfer.comm as comm
    ws = comm.create_allreduce_fusion_workspace("auto", world_size, rank, max_token_num, hidden_dim, dtype,
                                                comm_backend=my_comm, platform="host")
    comm.allreduce_fusion(x, ws, comm.AllReduceFusionPattern.kARResidualRMSNorm, residual_in=r,
                          residual_out=r, norm_out=y, rms_gamma=g, rms_eps=1e-6)

Tensors are anything with ``__dlpack__`` (numpy arrays, torch tensors). ``platform="host"`` runs fiar's kernels on the
host emulator (host tensors, no GPU); see the README's Python section for what is the same as FlashInfer and what
differs. When torch is importable, a call on torch tensors runs as the custom op ``torch.ops.fiar.allreduce_fusion``
(fiar/_torch.py), which torch.compile and CUDA-graph capture see.
"""
from __future__ import annotations

import importlib.util as _importlib_util
import itertools as _itertools
import weakref as _weakref
from typing import Any, Optional

from . import _fiar

__version__ = _fiar.version
__all__ = [
    "AllReduceFusionPattern",
    "QuantizationSFLayout",
    "Workspace",
    "TimeoutError",
    "MismatchError",
    "create_allreduce_fusion_workspace",
    "allreduce_fusion",
    "__version__",
]

#: A peer never came, or a call gave up waiting (fiar::timeout_error); the workspace is unusable afterwards.
TimeoutError = _fiar.TimeoutError  # noqa: A001 - fiar's class, a subclass of the builtin TimeoutError
#: Ranks made different calls (fiar::mismatch_error); the workspace is unusable afterwards.
MismatchError = _fiar.MismatchError


class AllReduceFusionPattern:
    """flashinfer.comm's pattern codes (0-11; 6, the MoE reduction, is not in fiar), then fiar's own from 100."""

    kAllReduce = 0
    kARResidualRMSNorm = 1
    kARResidualRMSNormFP8Quant = 2
    kARResidualRMSNormFP4Quant = 3
    kARResidualRMSNormOutFP8Quant = 4
    kARResidualRMSNormOutFP4Quant = 5
    kMoEReductionARResidualRMSNorm = 6
    kMoEFinalizeARResidualRMSNorm = 7
    kARResidualRMSNormPerTokenGroupFP8PackedQuant = 8
    kARResidualRMSNormOutPerTokenGroupFP8PackedQuant = 9
    kARResidualRMSNormDynamicFP8Quant = 10
    kARResidualRMSNormOutDynamicFP8Quant = 11
    # fiar's own (no FlashInfer code): the norm without a residual, the norm before and after the residual add, MXFP8,
    # per-token-group FP8 with fp32 scales, and the MoE finalize before a plain sum.
    kARRMSNorm = 100
    kARResidualRMSNormPrePost = 101
    kARResidualRMSNormMXFP8Quant = 102
    kARResidualRMSNormOutMXFP8Quant = 103
    kARResidualRMSNormPerTokenGroupFP8Float32Quant = 104
    kARResidualRMSNormOutPerTokenGroupFP8Float32Quant = 105
    kMoEFinalizeAllReduce = 106


class QuantizationSFLayout:
    """flashinfer.comm's block-scale layouts (NVFP4, MXFP8); fiar has no 8x4 swizzle."""

    SWIZZLED_128x4 = 0
    SWIZZLED_8x4 = 1
    LINEAR = 2


# fiar's Pattern enumerators (core/pattern.hpp, in order).
_ALLREDUCE, _RESIDUAL_RMSNORM, _FP8, _FP8_DYNAMIC, _NVFP4, _RMSNORM, _PREPOST, _FP8_GROUP, _MXFP8, _MOE_ALLREDUCE, \
    _MOE_RESIDUAL_RMSNORM = range(11)
_P = AllReduceFusionPattern
# code -> (fiar pattern, norm_out required, group scale format: 0 packed ue8m0, 1 float32)
_PATTERNS = {
    _P.kAllReduce: (_ALLREDUCE, False, 0),
    _P.kARResidualRMSNorm: (_RESIDUAL_RMSNORM, True, 0),
    _P.kARResidualRMSNormFP8Quant: (_FP8, False, 0),
    _P.kARResidualRMSNormFP4Quant: (_NVFP4, False, 0),
    _P.kARResidualRMSNormOutFP8Quant: (_FP8, True, 0),
    _P.kARResidualRMSNormOutFP4Quant: (_NVFP4, True, 0),
    _P.kMoEFinalizeARResidualRMSNorm: (_MOE_RESIDUAL_RMSNORM, True, 0),
    _P.kARResidualRMSNormPerTokenGroupFP8PackedQuant: (_FP8_GROUP, False, 0),
    _P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant: (_FP8_GROUP, True, 0),
    _P.kARResidualRMSNormDynamicFP8Quant: (_FP8_DYNAMIC, False, 0),
    _P.kARResidualRMSNormOutDynamicFP8Quant: (_FP8_DYNAMIC, True, 0),
    _P.kARRMSNorm: (_RMSNORM, True, 0),
    _P.kARResidualRMSNormPrePost: (_PREPOST, True, 0),
    _P.kARResidualRMSNormMXFP8Quant: (_MXFP8, False, 0),
    _P.kARResidualRMSNormOutMXFP8Quant: (_MXFP8, True, 0),
    _P.kARResidualRMSNormPerTokenGroupFP8Float32Quant: (_FP8_GROUP, False, 1),
    _P.kARResidualRMSNormOutPerTokenGroupFP8Float32Quant: (_FP8_GROUP, True, 1),
    _P.kMoEFinalizeAllReduce: (_MOE_ALLREDUCE, False, 0),
}
_QUANTIZED = {_FP8, _FP8_DYNAMIC, _NVFP4, _FP8_GROUP, _MXFP8}
_RESIDUAL = {_RESIDUAL_RMSNORM, _FP8, _FP8_DYNAMIC, _NVFP4, _PREPOST, _FP8_GROUP, _MXFP8, _MOE_RESIDUAL_RMSNORM}
# fiar's Strategy values (core/strategy.hpp).
_STRATEGIES = {"auto": 0, "oneshot": 1, "twoshot": 2, "multimem": 3, "nccl": 4}


def _dtype_name(dtype: Any) -> str:
    """'float32', 'float16' or 'bfloat16' from a torch dtype, a numpy dtype or type, or a string."""
    text = str(getattr(dtype, "name", None) or dtype).lower()
    for prefix in ("torch.", "<class 'numpy.", "numpy.", "<class 'ml_dtypes."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.rstrip("'>")
    aliases = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
               "bfloat16": "bfloat16", "bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
    if text not in aliases:
        raise TypeError(f"dtype {dtype!r}; allowed: float32, float16, bfloat16 (torch or numpy dtypes, or names)")
    return aliases[text]


def _python_comm(comm_backend: Any, group: Any) -> Any:
    """The bootstrap, in this order: comm_backend, group, an initialised default torch.distributed group; None
    (fiar's TCP bootstrap from the environment) without any."""
    if comm_backend is not None:
        for method in ("Get_rank", "Get_size", "allgather", "barrier"):
            if not callable(getattr(comm_backend, method, None)):
                raise TypeError(f"comm_backend lacks {method}(); it needs FlashInfer's CommBackend shape: Get_rank(), "
                                "Get_size(), allgather(obj) -> one entry per rank, barrier()")
        return comm_backend
    try:
        import torch.distributed as dist  # only when torch is there
    except ImportError:
        dist = None
    if group is not None or (dist is not None and dist.is_available() and dist.is_initialized()):
        if dist is None:
            raise TypeError("group is a torch.distributed process group, but torch is not importable")
        return _TorchGroup(dist, group)
    return None


class _TorchGroup:
    """CommBackend over a torch.distributed group (every exchange over it, never over WORLD unless it is WORLD)."""

    def __init__(self, dist: Any, group: Any) -> None:
        self._dist, self._group = dist, group

    def Get_rank(self) -> int:  # noqa: N802 - FlashInfer's names
        return self._dist.get_rank(self._group)

    def Get_size(self) -> int:  # noqa: N802
        return self._dist.get_world_size(self._group)

    def allgather(self, data: Any) -> list:
        out = [None] * self.Get_size()
        self._dist.all_gather_object(out, data, group=self._group)
        return out

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)


# Every live Workspace by a number of its own: the torch op takes the workspace as that number.
_WORKSPACES: "_weakref.WeakValueDictionary[int, Workspace]" = _weakref.WeakValueDictionary()
_WORKSPACE_IDS = _itertools.count(1)


class Workspace:
    """What create_allreduce_fusion_workspace returns: fiar's workspace of one backend and element type. A context
    manager (destroyed on exit)."""

    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._id = next(_WORKSPACE_IDS)  # a plain int: torch.compile traces fiar.allreduce_fusion and guards on it
        _WORKSPACES[self._id] = self

    @property
    def platform(self) -> str:
        """"cuda" or "host" (the host emulator)."""
        return self._impl.platform

    @property
    def backend(self) -> str:
        """The backend that runs the calls: "trtllm", "mnnvl" or "nccl"."""
        return self._impl.backend

    @property
    def world_size(self) -> int:
        return self._impl.world_size

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def dtype(self) -> str:
        return self._impl.dtype

    @property
    def last_strategy(self) -> str:
        """The strategy the last call ran ("oneshot", "twoshot", "multimem", "nccl"; "auto" on the nccl backend)."""
        return self._impl.last_strategy

    def is_buffer_size_sufficient(self, tp_size: int, num_tokens: int, hidden_dim: int, dtype: Any,
                                  use_oneshot: Optional[bool] = None) -> bool:
        """Whether a call of num_tokens tokens fits (FlashInfer's signature): the group size, hidden_dim and dtype
        must be the workspace's."""
        if tp_size != self.world_size or hidden_dim != self._impl.hidden_dim or _dtype_name(dtype) != self.dtype:
            return False
        strategy = 0 if use_oneshot is None else (_STRATEGIES["oneshot"] if use_oneshot else _STRATEGIES["twoshot"])
        return self._impl.fits(num_tokens, strategy)

    def check(self) -> None:
        """Raises what a call recorded: fiar.TimeoutError, fiar.MismatchError, a bad MoE index (ValueError)."""
        self._impl.check()

    def destroy(self) -> None:
        """Frees the workspace (idempotent); no call may be in flight on any rank."""
        self._impl.destroy()

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


def create_allreduce_fusion_workspace(backend: str = "auto", world_size: int = None, rank: int = None,
                                      max_token_num: int = None, hidden_dim: int = None, dtype: Any = None,
                                      gpus_per_node: int = None, comm_backend: Any = None,
                                      force_oneshot_support: bool = False, group: Any = None, *,
                                      platform: str = "cuda", timeout_ms: int = 30000,
                                      batch_invariant: bool = False) -> Workspace:
    """Collective: every rank of the group creates its workspace with the same arguments (bar rank).

    FlashInfer's parameters in FlashInfer's order, then fiar's keyword-only ones. backend: "auto", "trtllm",
    "mnnvl" or "nccl". platform: "cuda" (GPU tensors) or "host" (the host emulator: host tensors, every rank a
    thread or a process of this machine; it emulates sm_100 NVSwitch nodes of gpus_per_node ranks). The ranks meet
    over comm_backend, else group (torch.distributed), else the default torch.distributed group when initialised,
    else fiar's TCP bootstrap from the environment (FIAR_RANK / FIAR_WORLD_SIZE / FIAR_MASTER_PORT, torchrun's,
    Open MPI's or Slurm's variables).
    """
    for name, value in (("world_size", world_size), ("rank", rank), ("max_token_num", max_token_num),
                        ("hidden_dim", hidden_dim), ("dtype", dtype)):
        if value is None:
            raise ValueError(f"{name} is required")
    if platform not in ("cuda", "host"):
        raise ValueError(f"platform {platform!r}; allowed: 'cuda', 'host'")
    if platform == "cuda" and not _fiar.cuda:
        raise ValueError("platform 'cuda': this fiar was built without CUDA (FIAR_PYTHON_CUDA=0); use "
                         "platform='host', or reinstall with nvcc on the PATH")
    comm = _python_comm(comm_backend, group)
    impl = _fiar.Workspace(comm, str(backend), int(world_size), int(rank), int(max_token_num), int(hidden_dim),
                           _dtype_name(dtype), int(gpus_per_node or world_size), bool(force_oneshot_support),
                           int(timeout_ms), bool(batch_invariant), 100, platform)
    return Workspace(impl)


# torch, when importable: the custom op (fiar/_torch.py) is registered with fiar's import.
if _importlib_util.find_spec("torch") is not None:
    import torch as _torch_module

    from . import _torch as _torch_glue

    def _run_by_id(workspace_id: int, args: dict) -> None:
        """The torch op's call: the workspace registered under workspace_id."""
        ws = _WORKSPACES.get(workspace_id)
        if ws is None:
            raise RuntimeError(f"fiar: workspace {workspace_id} no longer exists (it was garbage-collected). Fix: "
                               "keep the fiar.Workspace alive while calls use it.")
        ws._impl.run(args)

    _torch_op = _torch_glue.register(_run_by_id)
else:
    _torch_module = _torch_op = None


def _is_torch(x: Any) -> bool:
    return _torch_module is not None and isinstance(x, _torch_module.Tensor)


def _scalar_like(x: Any, value: float) -> Any:
    """A one-element float32 tensor holding value, where x lives (a host array; a torch tensor on x's device)."""
    if _is_torch(x):
        return _torch_module.full((1,), value, dtype=_torch_module.float32, device=x.device)
    import numpy as np
    return np.full((1,), value, dtype=np.float32)


def _empty_like(x: Any, rows: Optional[int] = None) -> Any:
    """A new tensor of x's dtype on x's device (numpy or torch), of x's shape or `rows` rows of x's width."""
    shape = tuple(x.shape) if rows is None else (rows,) + tuple(x.shape[1:])
    if _is_torch(x):
        return _torch_module.empty(shape, dtype=x.dtype, device=x.device)
    if type(x).__module__.split(".")[0] == "numpy":
        import numpy as np
        return np.empty(shape, dtype=x.dtype)
    raise TypeError(f"cannot allocate a missing output like a {type(x).__name__}: pass it")


def allreduce_fusion(input: Any, workspace: Workspace, pattern: int, launch_with_pdl: bool = False,
                     trigger_completion_at_end: bool = True, output: Any = None, residual_out: Any = None,
                     norm_out: Any = None, quant_out: Any = None, scale_out: Any = None, residual_in: Any = None,
                     rms_gamma: Any = None, rms_eps: float = 1e-6, scale_factor: Any = None,
                     layout_code: Optional[int] = None, use_oneshot: Optional[bool] = None, fp32_acc: bool = False,
                     moe_reduction_device_num_experts: Optional[int] = None, moe_reduction_scale_input: Any = None,
                     moe_reduction_active_experts_token_input: Any = None, moe_reduction_token_input: Any = None,
                     expanded_idx_to_permuted_idx: Any = None, expert_scale_factor: Any = None,
                     shared_expert_output: Any = None, block_quant_group_size: Optional[int] = None,
                     weight_bias: float = 0.0, *, moe_finalize_backend: Optional[str] = None,
                     gamma_pre: Any = None, routed_scaling_factor: float = 1.0,
                     strategy: Optional[str] = None) -> Any:
    """The all-reduce of `input` fused with `pattern`'s epilogue (FlashInfer's arguments, names, order and defaults).

    Collective: every rank calls it with the same pattern and num_tokens. Returns norm_out if given (or allocated),
    else quant_out, else output. fiar's keyword-only extras: gamma_pre (kARResidualRMSNormPrePost),
    routed_scaling_factor (MoE finalize), strategy ("auto", "oneshot", "twoshot", "multimem", "nccl"; overrides
    use_oneshot). fp32_acc, launch_with_pdl and trigger_completion_at_end are accepted (fiar always accumulates in
    fp32, and on GPUs always uses programmatic dependent launch, releasing its successor at the end).
    """
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must come from fiar.create_allreduce_fusion_workspace, not {type(workspace)}")
    moe_reduction = (moe_reduction_device_num_experts, moe_reduction_scale_input,
                     moe_reduction_active_experts_token_input, moe_reduction_token_input)
    if pattern == _P.kMoEReductionARResidualRMSNorm or any(a is not None for a in moe_reduction):
        raise ValueError("pattern 6 (kMoEReductionARResidualRMSNorm, the moe_reduction_* arguments) is not in fiar: "
                         "use kMoEFinalizeARResidualRMSNorm (the finalize from the permuted expert output)")
    if moe_finalize_backend not in (None, "fiar"):
        raise ValueError(f"moe_finalize_backend {moe_finalize_backend!r}; fiar has one finalize: None or 'fiar'")
    if pattern not in _PATTERNS:
        raise ValueError(f"pattern {pattern!r}; allowed: the codes of fiar.AllReduceFusionPattern")
    fiar_pattern, wants_norm_out, group_scale = _PATTERNS[pattern]
    if strategy is None:
        strategy = "auto" if use_oneshot is None else ("oneshot" if use_oneshot else "twoshot")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy {strategy!r}; allowed: {', '.join(_STRATEGIES)}")
    if layout_code not in (None, QuantizationSFLayout.SWIZZLED_128x4, QuantizationSFLayout.LINEAR):
        raise ValueError(f"layout_code {layout_code!r}; allowed: QuantizationSFLayout.SWIZZLED_128x4 (0) or LINEAR "
                         "(2); fiar has no 8x4 swizzle")

    # The MoE patterns' outputs have a row per token (expanded_idx_to_permuted_idx's), `input` one per permuted row.
    moe = fiar_pattern in (_MOE_ALLREDUCE, _MOE_RESIDUAL_RMSNORM)
    rows = expanded_idx_to_permuted_idx.shape[0] if moe and expanded_idx_to_permuted_idx is not None else None
    if fiar_pattern in (_ALLREDUCE, _MOE_ALLREDUCE) and output is None:
        output = _empty_like(input, rows)
    if fiar_pattern in _RESIDUAL and residual_out is None and residual_in is not None:
        residual_out = _empty_like(residual_in)
    if wants_norm_out and norm_out is None:
        norm_out = _empty_like(input, rows)
    if not wants_norm_out and fiar_pattern in _QUANTIZED and norm_out is not None:
        raise ValueError(f"norm_out is set, but pattern {pattern} does not write it; pass None, or the pattern's "
                         "'Out' variant")

    args = {
        "pattern": fiar_pattern,
        "strategy": _STRATEGIES[strategy],
        "input": input,
        "output": output,
        "residual_in": residual_in,
        "residual_out": residual_out,
        "gamma": rms_gamma,
        "gamma_pre": gamma_pre,
        "norm_out": norm_out,
        "quant_out": quant_out,
        "eps": float(rms_eps),
        "weight_bias": float(weight_bias),
        # fiar's ScaleLayout: Swizzled128x4 = 0, Linear = 1 (FlashInfer's LINEAR is 2).
        "layout": 1 if layout_code == QuantizationSFLayout.LINEAR else 0,
        "group_scale": group_scale,
        "expanded_idx": expanded_idx_to_permuted_idx,
        "expert_scale": expert_scale_factor,
        "shared_expert_out": shared_expert_output,
        "routed_scaling_factor": float(routed_scaling_factor),
    }
    if fiar_pattern == _FP8_GROUP:
        if block_quant_group_size is None:
            raise ValueError("block_quant_group_size is required by the per-token-group FP8 patterns")
        args["group_size"] = int(block_quant_group_size)
    if fiar_pattern in (_NVFP4, _FP8_GROUP, _MXFP8):
        args["block_scale_out"] = scale_out
    else:
        args["scale_out"] = scale_out
    if scale_factor is not None:
        if isinstance(scale_factor, (int, float)):  # fiar reads the scale from memory, as FlashInfer's kernel does
            scale_factor = _scalar_like(input, float(scale_factor))
        args["scale"] = scale_factor
    # ml_dtypes' bfloat16 numpy arrays go as uint16 views (numpy's DLPack has no bfloat16), relabelled in C++.
    views = [k for k, v in args.items() if type(v).__module__ == "numpy" and v.dtype.name == "bfloat16"]
    if views:
        args.update({k: args[k].view("uint16") for k in views}, bf16_views=views)
    if _torch_op is not None and _is_torch(input):
        _torch_glue.call(_torch_op, workspace._id, args)  # the op takes the caller's current stream on a GPU
    else:
        workspace._impl.run(args)  # a CUDA tensor that is not torch's: the default stream
    if norm_out is not None:
        return norm_out
    if quant_out is not None:
        return quant_out
    return output
