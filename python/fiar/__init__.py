# SPDX-License-Identifier: Apache-2.0
"""fiar: fused all-reduce for tensor-parallel LLM inference, with flashinfer.comm's names and codes.

An engine that calls ``flashinfer.comm.create_allreduce_fusion_workspace`` and ``allreduce_fusion`` (or the legacy
``trtllm_create_ipc_workspace_for_all_reduce_fusion`` and ``trtllm_allreduce_fusion``) switches by changing the
import (``from fiar.mnnvl import TorchDistBackend`` for ``flashinfer.comm.mnnvl``'s)::

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
    "AllReduceFusionWorkspace",
    "TRTLLMAllReduceFusionWorkspace",
    "MNNVLAllReduceFusionWorkspace",
    "TimeoutError",
    "MismatchError",
    "create_allreduce_fusion_workspace",
    "allreduce_fusion",
    "trtllm_create_ipc_workspace_for_all_reduce_fusion",
    "trtllm_destroy_ipc_workspace_for_all_reduce_fusion",
    "trtllm_allreduce_fusion",
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
    """flashinfer.comm's block-scale layouts (NVFP4, MXFP8). fiar has no 8x4 swizzle: a call that writes block scales
    refuses it (FlashInfer's fusion kernels write no scales for it); other patterns ignore layout_code."""

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
_LAYOUT_CODES = {QuantizationSFLayout.SWIZZLED_128x4: 0, QuantizationSFLayout.LINEAR: 1}  # -> fiar's ScaleLayout
# The call's dict keys (module.cpp's CallArgs) -> fiar's FusedArgs names (fiar._fiar.tensor_uses' keys).
_FUSED_NAMES = {"input": "in", "output": "out", "residual_in": "residual_in", "residual_out": "residual_out",
                "gamma": "gamma", "gamma_pre": "gamma_pre", "norm_out": "norm_out", "quant_out": "quant_out",
                "scale": "scale", "scale_out": "scale_out", "block_scale_out": "block_scale_out",
                "expanded_idx": "expanded_idx_to_permuted_idx", "expert_scale": "expert_scale",
                "shared_expert_out": "shared_expert_out"}
_USES = {p: _fiar.tensor_uses(p) for p, _, _ in _PATTERNS.values()}
# FlashInfer's moe_finalize_backend values (its default "trtllm"): fiar has one finalize, which serves them all.
_MOE_FINALIZE_BACKENDS = (None, "trtllm", "cake", "fiar")
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
        from .mnnvl import TorchDistBackend
        return TorchDistBackend(group)
    return None


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

    @classmethod
    def _wrap(cls, impl: Any) -> "Workspace":
        """The workspace of the class that names impl's backend (FlashInfer's class names for trtllm and mnnvl)."""
        kind = {"trtllm": TRTLLMAllReduceFusionWorkspace, "mnnvl": MNNVLAllReduceFusionWorkspace}.get(impl.backend,
                                                                                                      Workspace)
        ws = kind.__new__(kind)
        Workspace.__init__(ws, impl)
        return ws


#: FlashInfer's name of the abstract workspace (its unified API's return type): fiar's Workspace.
AllReduceFusionWorkspace = Workspace


def _create_impl(backend: str, world_size: int, rank: int, max_token_num: int, hidden_dim: int, dtype: Any,
                 gpus_per_node: Optional[int], comm_backend: Any, force_oneshot_support: bool, group: Any,
                 platform: str, timeout_ms: int, batch_invariant: bool) -> Any:
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
    return _fiar.Workspace(comm, str(backend), int(world_size), int(rank), int(max_token_num), int(hidden_dim),
                           _dtype_name(dtype), int(gpus_per_node or world_size), bool(force_oneshot_support),
                           int(timeout_ms), bool(batch_invariant), 100, platform)


class TRTLLMAllReduceFusionWorkspace(Workspace):
    """A workspace of the trtllm backend (peer-mapped buffers on one node), with FlashInfer's constructor: collective,
    like create_allreduce_fusion_workspace(backend="trtllm", ...), which returns one."""

    def __init__(self, tp_size: int, tp_rank: int, max_token_num: int, hidden_dim: int, dtype: Any = "float16",
                 comm_backend: Any = None, group: Any = None, *, platform: str = "cuda", timeout_ms: int = 30000,
                 batch_invariant: bool = False) -> None:
        super().__init__(_create_impl("trtllm", tp_size, tp_rank, max_token_num, hidden_dim, dtype, None, comm_backend,
                                      False, group, platform, timeout_ms, batch_invariant))


class MNNVLAllReduceFusionWorkspace(Workspace):
    """A workspace of the mnnvl backend (NVLink multicast), with FlashInfer's constructor: collective. `mapping` is an
    object with FlashInfer's Mapping attributes world_size (or tp_size), rank (or tp_rank) and gpus_per_node.
    Without max_num_tokens, buffer_size_in_bytes sets it: that many bytes of one rank's rows (FlashInfer sizes its
    buffer from them)."""

    def __init__(self, mapping: Any, max_num_tokens: Optional[int] = None, hidden_dim: Optional[int] = None,
                 dtype: Any = None, buffer_size_in_bytes: Optional[int] = None, comm_backend: Any = None, *,
                 platform: str = "cuda", timeout_ms: int = 30000, batch_invariant: bool = False) -> None:
        world = getattr(mapping, "world_size", None) or getattr(mapping, "tp_size", None)
        rank = getattr(mapping, "rank", getattr(mapping, "tp_rank", None))
        if world is None or rank is None:
            raise TypeError(f"mapping {mapping!r} needs world_size (or tp_size) and rank (or tp_rank), as "
                            "FlashInfer's Mapping has")
        if max_num_tokens is None and buffer_size_in_bytes is not None and hidden_dim and dtype is not None:
            itemsize = 4 if _dtype_name(dtype) == "float32" else 2
            max_num_tokens = max(1, int(buffer_size_in_bytes) // (int(hidden_dim) * itemsize))
        if max_num_tokens is None:
            raise ValueError("max_num_tokens is required (or buffer_size_in_bytes with hidden_dim and dtype)")
        super().__init__(_create_impl("mnnvl", world, rank, max_num_tokens, hidden_dim, dtype,
                                      getattr(mapping, "gpus_per_node", None), comm_backend, False, None, platform,
                                      timeout_ms, batch_invariant))


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
    Open MPI's or Slurm's variables). Returns a TRTLLMAllReduceFusionWorkspace or MNNVLAllReduceFusionWorkspace
    (FlashInfer's classes), or a Workspace of the nccl backend.
    """
    return Workspace._wrap(_create_impl(backend, world_size, rank, max_token_num, hidden_dim, dtype, gpus_per_node,
                                        comm_backend, force_oneshot_support, group, platform, timeout_ms,
                                        batch_invariant))


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
                     strategy: Optional[str] = None, strict: bool = False) -> Any:
    """The all-reduce of `input` fused with `pattern`'s epilogue (FlashInfer's arguments, names, order and defaults).

    Collective: every rank calls it with the same pattern and num_tokens. Returns norm_out if the pattern writes it
    (given or allocated), else quant_out, else output. fiar's keyword-only extras: gamma_pre
    (kARResidualRMSNormPrePost), routed_scaling_factor (MoE finalize), strategy ("auto", "oneshot", "twoshot",
    "multimem", "nccl"; overrides use_oneshot). fp32_acc, launch_with_pdl and trigger_completion_at_end are accepted
    (fiar always accumulates in fp32, and on GPUs always uses programmatic dependent launch, releasing its successor
    at the end).

    As FlashInfer takes a call (strict=False): a tensor the pattern neither reads nor writes is ignored, whatever it
    is; layout_code matters only where there are block scales; quant_out and NVFP4 / MXFP8 block scales are byte
    buffers of any element type, at least as large as what is written. strict=True refuses all of these, as fiar's
    C++ call does.
    """
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must come from fiar.create_allreduce_fusion_workspace, not {type(workspace)}")
    moe_reduction = (moe_reduction_device_num_experts, moe_reduction_scale_input,
                     moe_reduction_active_experts_token_input, moe_reduction_token_input)
    if pattern == _P.kMoEReductionARResidualRMSNorm or (strict and any(a is not None for a in moe_reduction)):
        raise ValueError("pattern 6 (kMoEReductionARResidualRMSNorm, the moe_reduction_* arguments) is not in fiar: "
                         "use kMoEFinalizeARResidualRMSNorm (the finalize from the permuted expert output)")
    if moe_finalize_backend not in _MOE_FINALIZE_BACKENDS:
        raise ValueError(f"moe_finalize_backend {moe_finalize_backend!r}; allowed: None, 'trtllm', 'cake' "
                         "(FlashInfer's) or 'fiar': each runs fiar's one finalize")
    if pattern not in _PATTERNS:
        raise ValueError(f"pattern {pattern!r}; allowed: the codes of fiar.AllReduceFusionPattern")
    fiar_pattern, wants_norm_out, group_scale = _PATTERNS[pattern]
    if strategy is None:
        strategy = "auto" if use_oneshot is None else ("oneshot" if use_oneshot else "twoshot")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy {strategy!r}; allowed: {', '.join(_STRATEGIES)}")
    block_scales = fiar_pattern in (_NVFP4, _MXFP8)
    if (strict or block_scales) and layout_code is not None and layout_code not in _LAYOUT_CODES:
        raise ValueError(f"layout_code {layout_code!r}; allowed: QuantizationSFLayout.SWIZZLED_128x4 (0) or LINEAR "
                         "(2). fiar has no 8x4 swizzle (FlashInfer's fusion kernels write no block scales for it): "
                         "pass SWIZZLED_128x4, what block-scaled GEMMs read")
    if not wants_norm_out and fiar_pattern in _QUANTIZED and norm_out is not None:
        if strict:
            raise ValueError(f"norm_out is set, but pattern {pattern} does not write it; pass None, or the pattern's "
                             "'Out' variant")
        norm_out = None  # FlashInfer ignores it too
    # The call's tensors by module.cpp's names (the scales are block_scale_out where the pattern has block scales).
    scales = "block_scale_out" if fiar_pattern in (_NVFP4, _FP8_GROUP, _MXFP8) else "scale_out"
    t = {"input": input, "output": output, "residual_in": residual_in, "residual_out": residual_out,
         "gamma": rms_gamma, "gamma_pre": gamma_pre, "norm_out": norm_out, "quant_out": quant_out,
         "scale": scale_factor, scales: scale_out, "expanded_idx": expanded_idx_to_permuted_idx,
         "expert_scale": expert_scale_factor, "shared_expert_out": shared_expert_output}
    if not strict:  # what the pattern neither reads nor writes is not looked at
        uses = _USES[fiar_pattern]
        t = {k: None if uses[_FUSED_NAMES[k]] == "unused" else v for k, v in t.items()}

    # The MoE patterns' outputs have a row per token (expanded_idx_to_permuted_idx's), `input` one per permuted row.
    moe = fiar_pattern in (_MOE_ALLREDUCE, _MOE_RESIDUAL_RMSNORM)
    rows = t["expanded_idx"].shape[0] if moe and t["expanded_idx"] is not None else None
    if fiar_pattern in (_ALLREDUCE, _MOE_ALLREDUCE) and t["output"] is None:
        t["output"] = _empty_like(input, rows)
    if fiar_pattern in _RESIDUAL and t["residual_out"] is None and t["residual_in"] is not None:
        t["residual_out"] = _empty_like(t["residual_in"])
    if wants_norm_out and t["norm_out"] is None:
        t["norm_out"] = _empty_like(input, rows)
    if isinstance(t["scale"], (int, float)):  # fiar reads the scale from memory, as FlashInfer's kernel does
        t["scale"] = _scalar_like(input, float(t["scale"]))

    args = dict(t, pattern=fiar_pattern, strategy=_STRATEGIES[strategy], strict=bool(strict), eps=float(rms_eps),
                weight_bias=float(weight_bias or 0.0), group_scale=group_scale,
                routed_scaling_factor=float(routed_scaling_factor),
                layout=_LAYOUT_CODES.get(layout_code, 0))  # fiar's ScaleLayout (FlashInfer's LINEAR, 2, is its 1)
    if fiar_pattern == _FP8_GROUP:
        if block_quant_group_size is None:
            raise ValueError("block_quant_group_size is required by the per-token-group FP8 patterns")
        args["group_size"] = int(block_quant_group_size)
    # ml_dtypes' bfloat16 numpy arrays go as uint16 views (numpy's DLPack has no bfloat16), relabelled in C++.
    views = [k for k, v in args.items() if type(v).__module__ == "numpy" and v.dtype.name == "bfloat16"]
    if views:
        args.update({k: args[k].view("uint16") for k in views}, bf16_views=views)
    if _torch_op is not None and _is_torch(input):
        _torch_glue.call(_torch_op, workspace._id, args)  # the op takes the caller's current stream on a GPU
    else:
        workspace._impl.run(args)  # a CUDA tensor that is not torch's: the default stream
    return next((t[k] for k in ("norm_out", "quant_out") if t[k] is not None), t["output"])


# ---- FlashInfer's legacy trtllm entry points (flattened tensors, the workspace as a pointer table) ----


class LegacyFusionWorkspace:
    """What trtllm_create_ipc_workspace_for_all_reduce_fusion returns as its ipc_handles and workspace_tensor (one
    object, both places): fiar's trtllm workspaces for the element types its calls may use. FlashInfer's buffers take
    any 16-bit type (or float32 with use_fp32_lamport); fiar's workspace is typed, so this holds float16 and bfloat16
    workspaces (or one float32), all created up front, collectively."""

    def __init__(self, workspaces: dict, metadata: dict) -> None:
        self.workspaces, self.metadata = workspaces, metadata

    def of(self, dtype: Any) -> Workspace:
        name = _dtype_name(dtype)
        if name not in self.workspaces:
            lamport = self.metadata["use_fp32_lamport"]
            raise ValueError(f"use_fp32_lamport ({lamport}) does not match allreduce_in.dtype ({name}). Fix: create "
                             f"the workspace with use_fp32_lamport={name == 'float32'}.")
        return self.workspaces[name]

    def destroy(self) -> None:
        for ws in self.workspaces.values():
            ws.destroy()


def trtllm_create_ipc_workspace_for_all_reduce_fusion(tp_rank: int, tp_size: int, max_token_num: int, hidden_dim: int,
                                                      use_fp32_lamport: bool = False, group: Any = None,
                                                      create_metadata: bool = False, comm_backend: Any = None,
                                                      use_symm_dev_mem: bool = False, *, platform: str = "cuda",
                                                      timeout_ms: int = 30000, batch_invariant: bool = False):
    """FlashInfer's legacy creation (its parameters, order and defaults; collective). Returns (ipc_handles,
    workspace_tensor), plus metadata with create_metadata, plus mem_handles before it with use_symm_dev_mem as well,
    as FlashInfer does; ipc_handles and workspace_tensor are one LegacyFusionWorkspace, mem_handles an empty list.
    The workspaces are fiar's trtllm backend's, for float32 (use_fp32_lamport) or for float16 and bfloat16."""
    dtypes = ("float32",) if use_fp32_lamport else ("float16", "bfloat16")
    workspaces = {d: TRTLLMAllReduceFusionWorkspace(tp_size, tp_rank, max_token_num, hidden_dim, d, comm_backend,
                                                    group, platform=platform, timeout_ms=timeout_ms,
                                                    batch_invariant=batch_invariant) for d in dtypes}
    metadata = {"tp_rank": tp_rank, "tp_size": tp_size, "max_token_num": max_token_num, "hidden_dim": hidden_dim,
                "use_fp32_lamport": bool(use_fp32_lamport)}
    handle = LegacyFusionWorkspace(workspaces, metadata)
    if not create_metadata:
        return handle, handle
    return (handle, handle, [], metadata) if use_symm_dev_mem else (handle, handle, metadata)


def trtllm_destroy_ipc_workspace_for_all_reduce_fusion(workspace: Any, group: Any = None) -> None:
    """Frees what trtllm_create_ipc_workspace_for_all_reduce_fusion made (its ipc_handles); idempotent."""
    if not isinstance(workspace, LegacyFusionWorkspace):
        raise TypeError(f"workspace must be the ipc_handles of fiar.trtllm_create_ipc_workspace_for_all_reduce_fusion, "
                        f"not {type(workspace)}")
    workspace.destroy()


def _rows(x: Any, rows: int, cols: int) -> Any:
    """x as [rows, cols] (a view: FlashInfer's legacy call takes flattened contiguous tensors)."""
    return None if x is None else x.reshape(rows, cols)


def trtllm_allreduce_fusion(allreduce_in: Any, world_size: int, world_rank: int, token_num: int, hidden_dim: int,
                            workspace_ptrs: Any, launch_with_pdl: bool, trigger_completion_at_end: bool,
                            fp32_acc: bool, pattern_code: int, use_oneshot: Optional[bool], allreduce_out: Any,
                            residual_in: Any, residual_out: Any, norm_out: Any, quant_out: Any, scale_out: Any,
                            rms_gamma: Any, rms_eps: Optional[float], scale_factor: Any,
                            layout_code: Optional[int], metadata: Optional[dict] = None,
                            block_quant_group_size: Optional[int] = None, weight_bias: Optional[float] = None, *,
                            strict: bool = False) -> None:
    """FlashInfer's legacy call (its parameters and order): the activations flattened or [token_num, hidden_dim],
    the workspace from trtllm_create_ipc_workspace_for_all_reduce_fusion. Runs allreduce_fusion with the same
    meaning; writes the outputs, returns None."""
    if not isinstance(workspace_ptrs, LegacyFusionWorkspace):
        raise TypeError("workspace_ptrs must be the workspace_tensor of "
                        f"fiar.trtllm_create_ipc_workspace_for_all_reduce_fusion, not {type(workspace_ptrs)}")
    meta = workspace_ptrs.metadata if metadata is None else metadata
    if world_size != meta["tp_size"] or world_rank != meta["tp_rank"]:
        raise ValueError(f"world_size {world_size}, world_rank {world_rank}: the workspace was created for tp_size "
                         f"{meta['tp_size']}, tp_rank {meta['tp_rank']}. Fix: pass the tp_size and tp_rank it was "
                         "created with.")
    if hidden_dim != meta["hidden_dim"] or token_num > meta["max_token_num"]:
        raise ValueError(f"token_num {token_num} x hidden_dim {hidden_dim}: the workspace takes hidden_dim "
                         f"{meta['hidden_dim']} and up to max_token_num {meta['max_token_num']} tokens (fiar's "
                         "workspace has one hidden_dim). Fix: create it with this call's hidden_dim.")
    ws = workspace_ptrs.of(allreduce_in.dtype)
    T, H = int(token_num), int(hidden_dim)
    allreduce_fusion(_rows(allreduce_in, T, H), ws, pattern_code, launch_with_pdl, trigger_completion_at_end,
                     output=_rows(allreduce_out, T, H), residual_out=_rows(residual_out, T, H),
                     norm_out=_rows(norm_out, T, H), quant_out=quant_out, scale_out=scale_out,
                     residual_in=_rows(residual_in, T, H), rms_gamma=rms_gamma,
                     rms_eps=1e-6 if rms_eps is None else rms_eps, scale_factor=scale_factor,
                     layout_code=layout_code, use_oneshot=use_oneshot, fp32_acc=fp32_acc,
                     block_quant_group_size=block_quant_group_size, weight_bias=weight_bias or 0.0, strict=strict)
