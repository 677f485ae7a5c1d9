#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar-check behaviour: exit status and what it prints, for described and discovered topologies."""
import os
import re
import subprocess
import sys

EXE = sys.argv[1]

# (arguments, environment additions, expected exit status, regular expressions the output must match)
CASES = [
    (["--help"], {}, 0, [r"usage: fiar-check", r"--backend NAME"]),
    # The example: trtllm across two nodes without multicast is rejected, with nccl as the fix.
    (["--nodes", "2", "--gpus-per-node", "8", "--multicast", "no", "--backend", "trtllm"], {}, 2,
     [r"world_size 16, rank 0, 2 nodes", r"choice: REJECTED", r"'trtllm'.*2 nodes", r"Fix: use 'nccl'",
      r"FIAR_ALLREDUCE_BACKEND=nccl"]),
    (["--nodes", "2", "--gpus-per-node", "4", "--multicast", "yes", "--fabric", "yes", "--backend", "trtllm"], {}, 2,
     [r"Fix: use 'mnnvl'"]),
    (["--nodes", "2", "--gpus-per-node", "8"], {}, 0,
     [r"choice: nccl", r"mnnvl cannot run: no NVLink multicast", r"trtllm cannot run: the group spans 2 nodes"]),
    (["--nodes", "16", "--gpus-per-node", "4", "--multicast", "yes", "--fabric", "yes"], {}, 0,
     [r"choice: mnnvl", r"requested backend: auto \(default\)"]),
    (["--gpus-per-node", "8", "--multicast", "yes"], {}, 0,
     [r"choice: mnnvl", r"fallback: if multicast setup fails"]),
    (["--gpus-per-node", "8"], {}, 0, [r"choice: trtllm", r"mnnvl cannot run"]),
    (["--gpus-per-node", "8", "--backend", "mnnvl"], {}, 2, [r"choice: REJECTED", r"multicast_supported = false"]),
    (["--gpus-per-node", "8", "--peer-access", "no", "--backend", "trtllm"], {}, 2, [r"peer access"]),
    (["--world-size", "32", "--backend", "trtllm"], {}, 2, [r"world_size 32", r"1 to 16"]),
    (["--gpus-per-node", "6", "--backend", "trtllm"], {}, 0, [r"choice: trtllm", r"requested explicitly"]),
    (["--gpus-per-node", "8", "--arch", "sm_80", "--backend=mnnvl", "--multicast=yes"], {}, 2, [r"sm_90 or newer"]),
    (["--gpus-per-node", "8", "--arch", "sm_100a"], {}, 0, [r"arch sm_100"]),
    (["--nodes", "2", "--backend", "nccl"], {}, 0, [r"choice: nccl", r"requested explicitly"]),
    # The environment variable selects the backend when --backend is absent; --backend wins over it.
    (["--nodes", "2"], {"FIAR_ALLREDUCE_BACKEND": "TRTLLM"}, 2,
     [r"requested backend: trtllm \(FIAR_ALLREDUCE_BACKEND\)", r"REJECTED"]),
    (["--nodes", "2", "--backend", "auto"], {"FIAR_ALLREDUCE_BACKEND": "trtllm"}, 0, [r"choice: nccl"]),
    # Usage errors.
    (["--nodes", "2"], {"FIAR_ALLREDUCE_BACKEND": "nvls"}, 1, [r"FIAR_ALLREDUCE_BACKEND='nvls'"]),
    (["--backend", "tensorrt"], {}, 1, [r"unknown all-reduce backend 'tensorrt'"]),
    (["--nodes"], {}, 1, [r"--nodes needs a value"]),
    (["--nodes", "0"], {}, 1, [r"--nodes '0': expected an integer >= 1"]),
    (["--nodes", "two"], {}, 1, [r"expected an integer"]),
    (["--multicast", "maybe"], {}, 1, [r"expected yes or no"]),
    (["--arch", "hopper"], {}, 1, [r"expected an architecture"]),
    (["--frobnicate", "1"], {}, 1, [r"unknown option '--frobnicate'"]),
    (["--nodes", "4", "--world-size", "2"], {}, 1, [r"malformed topology: node_count = 4"]),
    (["--nodes", "2", "--gpus-per-node", "8", "--world-size", "12"], {}, 1, [r"contradicts"]),
    (["--rank", "8"], {}, 1, [r"malformed topology: rank = 8"]),
    # Discovery on this machine (with or without a GPU) always yields a valid choice.
    ([], {}, 0, [r"topology \(discovered: \d+ in-process rank", r"choice: (mnnvl|trtllm|nccl)"]),
]


def main() -> int:
    failures = 0
    for args, env_add, want_rc, patterns in CASES:
        env = {k: v for k, v in os.environ.items() if k not in ("FIAR_ALLREDUCE_BACKEND", "FIAR_NODE_ID")}
        env.update(env_add)
        p = subprocess.run([EXE] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
        problems = []
        if p.returncode != want_rc:
            problems.append(f"exit status {p.returncode}, expected {want_rc}")
        problems += [f"no match for /{pat}/" for pat in patterns if not re.search(pat, p.stdout)]
        label = " ".join(args) + (f" (env {env_add})" if env_add else "")
        if problems:
            failures += 1
            print(f"FAIL: fiar-check {label}: " + "; ".join(problems) + "\n" + p.stdout)
        else:
            print(f"ok: fiar-check {label} -> {p.returncode}")
    print(f"{len(CASES) - failures} of {len(CASES)} fiar-check cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
