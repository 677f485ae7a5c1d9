#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The built-in strategy table against the model it is derived from: `fiar-check --strategy-table` (the constexpr
table in core/strategy.hpp) must list, at every key `scripts/model --table` derives, the same NCCL step and the same
symmetric-window bound, and on NVLink the same one-shot threshold (trtllm's; the C++ threshold has no interconnect
key, so the model's PCIe value is reported, not taken); the in-switch reduction stays off (the model's value is
reported, not taken); and fiar-check prints the chosen backend's row for a described topology.

    check_table.py FIAR_CHECK MODEL"""
import json
import subprocess
import sys


def bytes_text(b):
    """As fiar-check prints a size: "128 KiB", "32 MiB"."""
    units = ["B", "KiB", "MiB", "GiB"]
    u = 0
    while u < 3 and b >= 1024 and b % 1024 == 0:
        b //= 1024
        u += 1
    return f"{b} {units[u]}"


def main():
    fiar_check, model = sys.argv[1], sys.argv[2]
    table = json.loads(subprocess.run([fiar_check, "--strategy-table"], check=True, capture_output=True,
                                      text=True).stdout)
    derived = json.loads(subprocess.run([sys.executable, model, "--table", "--json"], check=True,
                                        capture_output=True, text=True).stdout)
    rows = {(r["arch"], r["interconnect"], r["world"]): r for r in table}
    failures = []
    for d in derived:
        key = (d["arch"], d["interconnect"], d["world"])
        r = rows.get(key)
        if r is None:
            failures.append(f"{key}: in the model's table, not in fiar's")
            continue
        for field in ("nccl_min_bytes", "nccl_symmetric_max_bytes"):
            if r[field] != d[field]:
                failures.append(f"{key}: {field} is {r[field]} in fiar's table, {d[field]} in the model's")
        if d["interconnect"] == "nvlink" and r["trtllm_oneshot_max_bytes"] != d["oneshot_max_bytes"]:
            failures.append(f"{key}: the one-shot threshold is {r['trtllm_oneshot_max_bytes']} in fiar's table, "
                            f"{d['oneshot_max_bytes']} in the model's")
        if r["multimem_min_bytes"] is not None:
            failures.append(f"{key}: multimem_min_bytes is {r['multimem_min_bytes']}, but it stays off until measured")
    if len(derived) < 10:
        failures.append(f"the model derived only {len(derived)} rows")
    out = subprocess.run([fiar_check, "--world-size", "8", "--arch", "sm_90", "--interconnect", "nvlink",
                          "--backend", "trtllm"], capture_output=True, text=True)
    row = next(d for d in derived if (d["arch"], d["interconnect"], d["world"]) == (90, "nvlink", 8))
    want = (f"strategy table: one-shot up to {bytes_text(row['oneshot_max_bytes'])} per rank, two-shot beyond; "
            f"NCCL inside the workspace from {bytes_text(row['nccl_min_bytes'])}")
    if out.returncode != 0 or want not in out.stdout:
        failures.append(f"fiar-check does not print trtllm's row for 8 ranks of sm_90 ({want!r}):\n" + out.stdout +
                        out.stderr)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(derived)} rows compared, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
