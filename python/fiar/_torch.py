# SPDX-License-Identifier: Apache-2.0
"""fiar's call as a torch custom op, ``torch.ops.fiar.allreduce_fusion``, registered when torch is importable.

``fiar.allreduce_fusion`` on torch tensors goes through it, so ``torch.compile`` (Dynamo, AOT autograd,
functionalization) sees one opaque node that writes the outputs it is given (``mutates_args``), with a fake
implementation that writes nothing, and CUDA-graph capture records the launch on the capturing stream. The op
allocates nothing: the workspace exists before any call (and before capture), and the outputs are the caller's
(``fiar.allreduce_fusion`` makes the missing ones with ``torch.empty`` before the op, as a traced graph does).

The workspace travels as an integer (custom ops take tensors, numbers and strings): fiar.Workspace registers itself
under one at creation, and the op looks it up at run time.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

#: The op's arguments it writes (a subset may be None).
MUTATED = ("output", "residual_out", "norm_out", "quant_out", "scale_out")


def register(run: Callable[[int, dict], None]) -> Any:
    """Defines fiar::allreduce_fusion; run(workspace_id, args) makes the call (fiar/__init__.py's dict of arguments).
    Returns the op's overload packet (torch.ops.fiar.allreduce_fusion)."""

    @torch.library.custom_op("fiar::allreduce_fusion", mutates_args=MUTATED)
    def allreduce_fusion(workspace: int, pattern: int, strategy: int, strict: bool, block_scales: bool,
                         input: torch.Tensor, output: Optional[torch.Tensor], residual_out: Optional[torch.Tensor],
                         norm_out: Optional[torch.Tensor], quant_out: Optional[torch.Tensor],
                         scale_out: Optional[torch.Tensor], residual_in: Optional[torch.Tensor],
                         gamma: Optional[torch.Tensor], gamma_pre: Optional[torch.Tensor],
                         scale: Optional[torch.Tensor], expanded_idx: Optional[torch.Tensor],
                         expert_scale: Optional[torch.Tensor], shared_expert_out: Optional[torch.Tensor],
                         eps: float, weight_bias: float, layout: int, group_size: int, group_scale: int,
                         routed_scaling_factor: float) -> None:
        args = {
            "pattern": pattern, "strategy": strategy, "strict": strict, "input": input, "output": output,
            "residual_out": residual_out, "norm_out": norm_out, "quant_out": quant_out,
            ("block_scale_out" if block_scales else "scale_out"): scale_out, "residual_in": residual_in,
            "gamma": gamma, "gamma_pre": gamma_pre, "scale": scale, "expanded_idx": expanded_idx,
            "expert_scale": expert_scale, "shared_expert_out": shared_expert_out, "eps": eps,
            "weight_bias": weight_bias, "layout": layout, "group_size": group_size, "group_scale": group_scale,
            "routed_scaling_factor": routed_scaling_factor,
        }
        if input.is_cuda:  # the caller's current stream: the one being captured, under CUDA-graph capture
            args["stream"] = int(torch.cuda.current_stream(input.device).cuda_stream)
        run(workspace, args)

    @allreduce_fusion.register_fake
    def _(workspace, pattern, strategy, strict, block_scales, input, output, residual_out, norm_out, quant_out,
          scale_out, residual_in, gamma, gamma_pre, scale, expanded_idx, expert_scale, shared_expert_out, eps,
          weight_bias, layout, group_size, group_scale, routed_scaling_factor) -> None:
        return None  # the outputs are written in place: nothing to make

    return torch.ops.fiar.allreduce_fusion


def op_args(workspace_id: int, args: dict) -> tuple:
    """The op's positional arguments for fiar/__init__.py's dict of one call's arguments."""
    block_scales = "block_scale_out" in args
    return (workspace_id, args["pattern"], args["strategy"], args.get("strict", True), block_scales, args["input"],
            args["output"], args["residual_out"], args["norm_out"], args["quant_out"],
            args["block_scale_out"] if block_scales else args.get("scale_out"), args["residual_in"], args["gamma"],
            args["gamma_pre"], args.get("scale"), args["expanded_idx"], args["expert_scale"],
            args["shared_expert_out"], args["eps"], args["weight_bias"], args["layout"], args.get("group_size", 128),
            args["group_scale"], args["routed_scaling_factor"])


def call(op: Any, workspace_id: int, args: dict) -> None:
    """The op on fiar/__init__.py's dict of one call's arguments."""
    op(*op_args(workspace_id, args))
