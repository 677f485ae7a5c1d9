# SPDX-License-Identifier: Apache-2.0
"""One rank of fiar's torch.distributed tests: a gloo process group from torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), then fiar's workspaces over it; prints one JSON line.

    torch_rank_main.py subgroups   two halves of the world, each a workspace over its own group (group=)
    torch_rank_main.py default     one workspace over the default group (no comm_backend, no group)

Every rank runs every pattern of the numpy reference on torch tensors, eagerly and inside
torch.compile(fullgraph=True), each checked bit for bit here.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fiar  # noqa: E402
import cases  # noqa: E402
import reference as ref  # noqa: E402

mode = sys.argv[1]
report = {"rank": int(os.environ["RANK"]), "wrong": {}, "backend": None, "world": None, "error": ""}
try:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = None
    if mode == "subgroups":  # every rank creates both groups (torch's rule), then uses its own
        halves = [list(range(world // 2)), list(range(world // 2, world))]
        groups = [dist.new_group(h) for h in halves]
        group = groups[rank // (world // 2)]
    ws_rank = dist.get_rank(group) if group is not None else rank
    ws_world = dist.get_world_size(group) if group is not None else world
    dtype, tokens, hidden = np.float16, 5, 256
    with fiar.create_allreduce_fusion_workspace("auto", ws_world, ws_rank, tokens, hidden, torch.float16,
                                                group=group, platform="host", timeout_ms=20000) as ws:
        report["backend"], report["world"] = ws.backend, ws.world_size
        report["wrong"] = cases.wrong_bits(ws, dtype, tokens, hidden, ws_rank, ws_world, tensor=torch.from_numpy)

        # Compiled: the residual updated in place (residual_in is residual_out), the norm allocated in the graph.
        P = fiar.AllReduceFusionPattern

        @torch.compile(fullgraph=True, backend="aot_eager")
        def layer(x, residual, gamma):
            return fiar.allreduce_fusion(x, ws, P.kARResidualRMSNorm, residual_in=residual, residual_out=residual,
                                         rms_gamma=gamma, rms_eps=cases.EPS)

        residual = torch.from_numpy(ref.residual(dtype, tokens, hidden).copy())
        norm = layer(torch.from_numpy(ref.inputs(dtype, tokens, hidden, ws_rank)), residual,
                     torch.from_numpy(ref.weights(dtype, hidden, 1)))
        want = cases.expected(P.kARResidualRMSNorm, dtype, tokens, hidden, ws_world)
        report["wrong"]["compiled"] = cases.mismatches({"residual_out": residual.numpy(), "norm_out": norm.numpy()},
                                                       want)
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - reported to the test
    report["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(report))
sys.exit(0 if not report["error"] else 1)
