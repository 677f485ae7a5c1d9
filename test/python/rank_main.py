# SPDX-License-Identifier: Apache-2.0
"""One rank of fiar's Python process tests: the workspace over fiar's TCP bootstrap from the environment (FIAR_RANK,
FIAR_WORLD_SIZE, FIAR_MASTER_PORT), every pattern once, each checked here; prints one JSON line.

    rank_main.py DTYPE TOKENS HIDDEN [BACKEND]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fiar  # noqa: E402
import cases  # noqa: E402

dtype, tokens, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
backend = sys.argv[4] if len(sys.argv) > 4 else "auto"
rank, world = int(os.environ["FIAR_RANK"]), int(os.environ["FIAR_WORLD_SIZE"])
report = {"rank": rank, "wrong": {}, "backend": None, "error": ""}
try:
    with fiar.create_allreduce_fusion_workspace(backend, world, rank, tokens, hidden, dtype, platform="host",
                                                timeout_ms=20000) as ws:
        report["backend"] = ws.backend
        report["wrong"] = cases.wrong_bits(ws, dtype, tokens, hidden, rank, world)
        ws.check()
except Exception as e:  # noqa: BLE001 - reported to the test
    report["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(report))
sys.exit(0 if not report["error"] else 1)
