#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar-demo on the host emulator: results verified, exit status 0 / 1 / 2 as documented; what fiar logs at each
FIAR_LOG_LEVEL (one fallback warning per group, one info line per workspace)."""
import os
import re
import subprocess
import sys

EXE = sys.argv[1]
HOST = ["--platform", "host"]
SMALL = ["--tokens", "5", "--hidden", "64", "--iterations", "3"]

CASES = [
    (HOST, 0, [r"platform host", r"backend: trtllm \(auto; mnnvl cannot run: no NVLink multicast",
               r"ran: trtllm\n", r"fiar-demo: PASS: 4 rank\(s\) x 10 iteration\(s\)", r"ranks bit-identical"]),
    (["--help"], 0, [r"usage: fiar-demo"]),
    # Auto on one node with multicast: mnnvl, no fallback.
    (HOST + SMALL + ["--multicast", "yes"], 0, [r"backend: mnnvl \(auto; trtllm if multicast setup fails\)",
                                                r"ran: mnnvl\n", r"PASS"]),
    # Multicast reported but its setup fails on the machine: auto falls back to trtllm, with one warning for the
    # group (rank 0 logs it), not one per rank.
    (HOST + SMALL + ["--multicast", "broken", "--world-size", "3"], 0,
     [r"ran: trtllm \(mnnvl's multicast setup failed", r"fiar \[warning\] rank 0: backend auto chose mnnvl",
      r"falling back to trtllm on all 3 ranks", r"PASS: 3 rank"]),
    # An explicit mnnvl whose setup fails is never replaced.
    (HOST + SMALL + ["--multicast", "broken", "--backend", "mnnvl"], 1, [r"NVLink multicast setup failed", r"FAIL"]),
    # mnnvl and nccl run on the emulator; every strategy and several world sizes.
    (HOST + SMALL + ["--backend", "mnnvl", "--multicast", "yes", "--world-size", "16", "--strategy", "twoshot"], 0,
     [r"ran: mnnvl\n", r"-> twoshot", r"PASS: 16 rank"]),
    (HOST + SMALL + ["--backend", "mnnvl", "--multicast", "yes", "--nodes", "2", "--world-size", "8"], 0,
     [r"ran: mnnvl\n", r"PASS: 8 rank"]),
    (HOST + SMALL + ["--backend", "nccl", "--world-size", "3", "--pattern", "residual_rmsnorm_fp8_dynamic"], 0,
     [r"ran: nccl\n", r"-> nccl \(its own algorithm\)", r"PASS: 3 rank"]),
    # Several nodes without multicast: auto picks nccl.
    (HOST + SMALL + ["--nodes", "2"], 0, [r"backend: nccl \(auto; mnnvl cannot run: no NVLink multicast",
                                         r"trtllm cannot run: the group spans 2 nodes", r"ran: nccl\n", r"PASS"]),
    (HOST + SMALL + ["--arch", "sm_100", "--world-size", "3"], 0, [r"arch sm_100", r"PASS: 3 rank"]),
    # Rejected configurations: nothing runs, exit 2, the reason on stderr.
    (HOST + SMALL + ["--nodes", "2", "--world-size", "8", "--backend", "trtllm"], 2,
     [r"REJECTED", r"'trtllm' cannot run on a group that spans 2 nodes", r"Fix: use 'nccl'"]),
    (HOST + SMALL + ["--backend", "mnnvl"], 2, [r"needs NVLink multicast"]),
    (HOST + SMALL + ["--backend", "mnnvl", "--multicast", "no"], 2, [r"REJECTED", r"needs NVLink multicast"]),
    (HOST + SMALL + ["--backend", "mnnvl", "--multicast", "yes", "--world-size", "65"], 2,
     [r"does not support world_size 65"]),
    (HOST + SMALL + ["--world-size", "17", "--backend", "trtllm"], 2, [r"does not support world_size 17"]),
    (HOST + ["--dtype", "half", "--hidden", "12", "--tokens", "2"], 2, [r"hidden_dim = 12 for half"]),
    (HOST + ["--tokens", "0"], 2, [r"--tokens '0': expected an integer >= 1"]),
    (HOST + ["--dtype", "fp8"], 2, [r"expected one of float, half, bf16"]),
    (HOST + ["--pattern", "rms_norm"], 2, [r"expected one of allreduce, residual_rmsnorm, .*, rmsnorm, residual_rmsnorm_prepost, residual_rmsnorm_fp8_group, residual_rmsnorm_mxfp8, moe_finalize_allreduce, moe_finalize_residual_rmsnorm"]),
    # NVFP4 needs 16-bit input and sm_100: rejected before anything runs, never silent zeros.
    (HOST + SMALL + ["--pattern", "residual_rmsnorm_nvfp4", "--dtype", "float", "--arch", "sm_100"], 2,
     [r"it takes 16-bit input"]),
    (HOST + SMALL + ["--pattern", "residual_rmsnorm_nvfp4", "--dtype", "bf16"], 2, [r"needs sm_100 or newer"]),
    # The default shape (16 x 4096) in half: some norm outputs are correctly rounded fp16 subnormals, which the bound
    # must accept (it has an absolute term of one subnormal step).
    (HOST + ["--dtype", "half", "--pattern", "residual_rmsnorm", "--iterations", "2"], 0,
     [r"PASS: 4 rank\(s\) x 2 iteration\(s\)", r" 0 element\(s\) outside the bound"]),
    (HOST + ["--dtype", "half", "--pattern", "residual_rmsnorm_fp8_dynamic", "--iterations", "2"], 0, [r"PASS"]),
    # A rank that fails runs nothing to compare: the summary says so, never "0 outside the bound, bit-identical".
    (HOST + SMALL + ["--multicast", "broken", "--backend", "mnnvl"], 1,
     [r"FAIL: 4 of 4 rank\(s\) failed \(see above\); their results were not verified",
      r"rank 0 failed \(and rank\(s\) 1, 2, 3\): fiar: NVLink multicast setup failed"]),
]
# What fiar logs, by FIAR_LOG_LEVEL: (arguments, environment, expected exit status, {pattern: how many lines match}).
WARNING = r"^fiar \[warning\] .*backend auto chose mnnvl"
INFO = r"^fiar \[info\] workspace: backend "
LOG_CASES = [
    # Default (warning): exactly one fallback line for the group, short, and no info line.
    (HOST + SMALL + ["--multicast", "broken", "--world-size", "3"], {}, 0, {WARNING: 1, INFO: 0, r"^fiar \[": 1}),
    (HOST + SMALL + ["--multicast", "broken", "--world-size", "16"], {}, 0, {WARNING: 1}),
    (HOST + SMALL, {}, 0, {r"^fiar \[": 0}),
    # info: one line about the backend choice, with its reasons, per workspace.
    (HOST + SMALL, {"FIAR_LOG_LEVEL": "info"}, 0,
     {INFO: 1, r"^fiar \[info\] workspace: backend trtllm \(auto\) for 4 ranks on 1 node, bf16, max 5 tokens x 64; "
      r"mnnvl cannot run: no NVLink multicast": 1, WARNING: 0}),
    (HOST + SMALL + ["--backend", "nccl", "--world-size", "2"], {"FIAR_LOG_LEVEL": "INFO"}, 0,
     {r"^fiar \[info\] workspace: backend nccl \(requested\) for 2 ranks": 1, r"^fiar \[": 1}),
    (HOST + SMALL + ["--multicast", "broken"], {"FIAR_LOG_LEVEL": "info"}, 0,
     {WARNING: 1, r"^fiar \[info\] workspace: backend trtllm \(auto; mnnvl's multicast setup failed": 1, INFO: 1}),
    # debug adds why the multicast setup failed.
    (HOST + SMALL + ["--multicast", "broken"], {"FIAR_LOG_LEVEL": "debug"}, 0,
     {WARNING: 1, INFO: 1, r"^fiar \[debug\] workspace: why multicast setup failed: NVLink multicast setup failed": 1}),
    # error: no warning at all, and the run is the same.
    (HOST + SMALL + ["--multicast", "broken"], {"FIAR_LOG_LEVEL": "error"}, 0,
     {r"\[warning\]": 0, r"^fiar \[": 0, r"^ran: trtllm \(mnnvl's multicast setup failed; fell back to trtllm\)$": 1,
      r"^fiar-demo: PASS": 1}),
    # An invalid value: one warning naming it and the allowed ones, then warning.
    (HOST + SMALL + ["--multicast", "broken"], {"FIAR_LOG_LEVEL": "loud"}, 0,
     {r"^fiar \[warning\] FIAR_LOG_LEVEL='loud' is not a log level; allowed: error, warning, info, debug": 1,
      WARNING: 1, INFO: 0}),
]
# Every fused pattern x dtype x strategy, verified against the reference.
for pattern in ("residual_rmsnorm", "residual_rmsnorm_fp8", "residual_rmsnorm_fp8_dynamic", "residual_rmsnorm_nvfp4",
                "rmsnorm", "residual_rmsnorm_prepost", "residual_rmsnorm_fp8_group", "residual_rmsnorm_mxfp8",
                "moe_finalize_residual_rmsnorm"):
    for dtype in ("float", "half", "bf16"):
        if pattern.endswith("nvfp4") and dtype == "float":
            continue
        for strategy in ("oneshot", "twoshot"):
            CASES.append((HOST + ["--pattern", pattern, "--dtype", dtype, "--strategy", strategy, "--arch", "sm_100",
                                  "--tokens", "6", "--hidden", "256", "--iterations", "2", "--world-size", "4"], 0,
                          [r"pattern: %s" % pattern, r"fiar-demo: PASS"]))
# The same patterns through mnnvl (alternating strategies) and nccl (its own algorithm).
for i, pattern in enumerate(("allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8", "residual_rmsnorm_fp8_dynamic",
                             "residual_rmsnorm_nvfp4", "rmsnorm", "residual_rmsnorm_prepost",
                             "residual_rmsnorm_fp8_group", "residual_rmsnorm_mxfp8", "moe_finalize_allreduce",
                             "moe_finalize_residual_rmsnorm")):
    for dtype in ("float", "half", "bf16"):
        if pattern.endswith("nvfp4") and dtype == "float":
            continue
        common = HOST + ["--pattern", pattern, "--dtype", dtype, "--arch", "sm_100", "--tokens", "6", "--hidden", "256",
                         "--iterations", "2", "--world-size", "4"]
        strategy = ("oneshot", "twoshot")[i % 2]
        CASES.append((common + ["--backend", "mnnvl", "--multicast", "yes", "--strategy", strategy], 0,
                      [r"ran: mnnvl\n", r"-> %s" % strategy, r"fiar-demo: PASS"]))
        CASES.append((common + ["--backend", "nccl"], 0, [r"ran: nccl\n", r"fiar-demo: PASS"]))
# Every dtype x strategy x several world sizes, verified against the reference.
for dtype in ("float", "half", "bf16"):
    for strategy in ("oneshot", "twoshot", "auto"):
        for world in ("2", "6"):
            CASES.append((HOST + SMALL + ["--dtype", dtype, "--strategy", strategy, "--world-size", world], 0,
                          [r"fiar-demo: PASS", r"strategy %s" % strategy]))


def main() -> int:
    failures = 0
    env = {k: v for k, v in os.environ.items() if k not in ("FIAR_ALLREDUCE_BACKEND", "FIAR_LOG_LEVEL")}
    for args, want, patterns in CASES:
        p = subprocess.run([EXE] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        problems = [] if p.returncode == want else [f"exit status {p.returncode}, expected {want}"]
        problems += [f"no match for /{pat}/" for pat in patterns if not re.search(pat, p.stdout)]
        if problems:
            failures += 1
            print(f"FAIL: fiar-demo {' '.join(args)}: {'; '.join(problems)}\n{p.stdout}")
        else:
            print(f"ok: fiar-demo {' '.join(args)} -> {p.returncode}")
    print(f"{len(CASES) - failures} of {len(CASES)} fiar-demo cases passed")
    log_failures = 0
    for args, env_add, want, counts in LOG_CASES:
        p = subprocess.run([EXE] + args, env={**env, **env_add}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        problems = [] if p.returncode == want else [f"exit status {p.returncode}, expected {want}"]
        lines = p.stdout.splitlines()
        for pat, n in counts.items():
            got = sum(1 for line in lines if re.search(pat, line))
            if got != n:
                problems.append(f"{got} line(s) match /{pat}/, expected {n}")
        problems += [f"a log line of {len(line)} characters: {line}" for line in lines
                     if re.search(WARNING, line) and len(line) > 230]
        label = f"{' '.join(f'{k}={v}' for k, v in env_add.items())} fiar-demo {' '.join(args)}"
        if problems:
            log_failures += 1
            print(f"FAIL: {label}: {'; '.join(problems)}\n{p.stdout}")
        else:
            print(f"ok: {label} -> {p.returncode}")
    print(f"{len(LOG_CASES) - log_failures} of {len(LOG_CASES)} FIAR_LOG_LEVEL cases passed")
    return 1 if failures or log_failures else 0


if __name__ == "__main__":
    sys.exit(main())
