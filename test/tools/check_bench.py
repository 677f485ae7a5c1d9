#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar-bench on the host emulator: a small sweep of every backend with every strategy, every row checked (#wrong 0),
the JSON and CSV outputs parsed; --plan without a GPU (at least 8 blocks for 1 token x 8192 at W = 8); the plot
script's text mode over the JSON; bad command lines exit 2."""
import csv
import json
import os
import subprocess
import sys
import tempfile

EXE = sys.argv[1]
PLOT = sys.argv[2]
KEYS = {"size_bytes", "tokens", "hidden", "dtype", "pattern", "backend", "strategy", "time_us", "algbw_gbps",
        "busbw_gbps", "wrong"}
PLAN_KEYS = {"size_bytes", "tokens", "hidden", "dtype", "pattern", "backend", "strategy", "blocks", "threads",
             "cluster"}
failures = []


def run(args, expect):
    p = subprocess.run([EXE] + args, capture_output=True, text=True, timeout=500)
    if p.returncode != expect:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p


with tempfile.TemporaryDirectory() as tmp:
    js, cs = os.path.join(tmp, "rows.json"), os.path.join(tmp, "rows.csv")
    # trtllm (auto's choice without multicast) and the nccl baseline; then mnnvl with multicast.
    p = run(["--platform", "host", "--world-size", "3", "--tokens", "1,5", "--hidden", "256", "-n", "3", "-w", "1",
             "--pattern", "allreduce,residual_rmsnorm,residual_rmsnorm_fp8_dynamic", "--json", js, "--csv", cs], 0)
    if "times NOT representative" not in p.stdout:
        failures.append("the host emulator's times are not labelled as not representative:\n" + p.stdout)
    rows = json.load(open(js))
    if len(rows) != 2 * 3 * 3 + 2 * 3:  # trtllm: points x patterns x 3 strategies; nccl: points x patterns
        failures.append(f"{len(rows)} JSON rows, expected 24")
    seen = set()
    for r in rows:
        if not KEYS <= set(r):
            failures.append(f"a row lacks {KEYS - set(r)}: {r}")
            continue
        seen.add((r["backend"], r["strategy"]))
        if r["wrong"] != 0 or r.get("error"):
            failures.append(f"wrong results: {r}")
        if r["size_bytes"] != r["tokens"] * r["hidden"] * 2 or r["time_us"] <= 0:
            failures.append(f"size or time off: {r}")
        expect_bus = r["algbw_gbps"] * 2 * (3 - 1) / 3
        if abs(r["busbw_gbps"] - expect_bus) > 1e-12 * max(1e-9, expect_bus):
            failures.append(f"busbw is not algbw x 2(W-1)/W (full precision): {r}")
    # Full precision: the emulator's times (thousands of microseconds, fractions of one) keep more than 4 digits.
    digits = max(len(repr(float(r["time_us"])).split("e")[0].replace(".", "").strip("0")) for r in rows)
    if digits <= 4:
        failures.append(f"JSON times keep {digits} significant digits at most: written rounded")
    for want in [("trtllm", "oneshot"), ("trtllm", "twoshot"), ("trtllm", "auto"), ("nccl", "auto")]:
        if want not in seen:
            failures.append(f"no {want} rows")
    with open(cs) as f:
        csv_rows = list(csv.DictReader(f))
    if len(csv_rows) != len(rows) or any(c["wrong"] != "0" for c in csv_rows):
        failures.append(f"CSV: {len(csv_rows)} rows / wrong values: {csv_rows[:2]}")
    # The plot script reads the JSON (text mode needs no matplotlib).
    q = subprocess.run([sys.executable, PLOT, js, "--text"], capture_output=True, text=True)
    if q.returncode != 0 or "W=3 trtllm oneshot" not in q.stdout or not q.stdout.startswith(
            "fiar-bench: host emulator: not representative, W=3, bf16"):
        failures.append(f"plot-bench --text: exit {q.returncode}\n{q.stdout}\n{q.stderr}")

    run(["--platform", "host", "--world-size", "4", "--multicast", "yes", "--backend", "mnnvl", "-b", "256",
         "-e", "4K", "-f", "4", "-n", "2", "-w", "0", "--verify-calls", "0", "--json", js], 0)
    rows = json.load(open(js))
    if {r["size_bytes"] for r in rows} != {256, 1024, 4096} or any(r["wrong"] != 0 for r in rows):
        failures.append(f"mnnvl size sweep: {rows}")
    # mnnvl's rows include the in-switch reduction by default, checked like the others.
    multimem = [r for r in rows if r["strategy"] == "multimem"]
    if len(multimem) != 3 or any(r["ran"] != "multimem" or r["wrong"] != 0 for r in multimem):
        failures.append(f"mnnvl multimem rows: {multimem}")

    # trtllm's NCCL route: forced rows and auto from --nccl-min-bytes (4 tokens x 64 bf16 = 512 bytes), checked.
    run(["--platform", "host", "--world-size", "3", "--backend", "trtllm", "--strategy", "nccl,auto", "--tokens",
         "1,4", "--hidden", "64", "--nccl-min-bytes", "512", "-n", "2", "-w", "0", "--json", js], 0)
    rows = json.load(open(js))
    ran = {(r["strategy"], r["tokens"]): r["ran"] for r in rows}
    if ran != {("nccl", 1): "nccl", ("nccl", 4): "nccl", ("auto", 1): "oneshot", ("auto", 4): "nccl"} or \
            any(r["wrong"] != 0 for r in rows):
        failures.append(f"trtllm NCCL route rows: {rows}")

    # --plan: no GPU needed; the decode-size call is spread over a cluster of 8 blocks.
    pj = os.path.join(tmp, "plan.json")
    run(["--plan", "--world-size", "8", "--tokens", "1,64,4096", "--hidden", "8192", "--sms", "132",
         "--pattern", "allreduce,residual_rmsnorm", "--json", pj], 0)
    plan = json.load(open(pj))
    for r in plan:
        if not PLAN_KEYS <= set(r) or "time_us" in r:
            failures.append(f"plan row keys: {r}")
        if r["backend"] == "trtllm":
            if r["tokens"] == 1 and (r["blocks"] < 8 or r["cluster"] != 8 or r["threads"] != 128):
                failures.append(f"1 token x 8192 at W = 8 is not spread over 8 blocks: {r}")
            routed = r["ran"] == "nccl"
            if routed and r["pattern"] == "allreduce":
                if r["blocks"] != 0 or r["kernel"] != "ncclAllReduce only":
                    failures.append(f"a plain all-reduce handed to NCCL launches no fiar kernel: {r}")
            elif r["blocks"] > 132 or r["blocks"] % r["cluster"] != 0 or r["threads"] % 32 != 0:
                failures.append(f"plan shape out of bounds: {r}")
            # The strategy table at W = 8 on sm_90: two-shot at 1 MiB, NCCL inside the workspace from 32 MiB.
            want = {1: "oneshot", 64: "twoshot", 4096: "nccl"}[r["tokens"]]
            if r["strategy"] == "auto" and r["ran"] != want:
                failures.append(f"auto at {r['tokens']} tokens x 8192 ran {r['ran']}, not {want}: {r}")
    # Without the route, the largest size stays on two-shot.
    run(["--plan", "--world-size", "8", "--tokens", "4096", "--hidden", "8192", "--strategy", "auto",
         "--nccl-min-bytes", "never", "--backend", "trtllm", "--json", pj], 0)
    plan = json.load(open(pj))
    if len(plan) != 1 or plan[0]["ran"] != "twoshot":
        failures.append(f"--nccl-min-bytes never: {plan}")

for args in (["--bogus", "1"], ["--tokens", "0"], ["--strategy", "threeshot"], ["-b", "1K"]):
    run(args, 2)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("fiar-bench: OK")
