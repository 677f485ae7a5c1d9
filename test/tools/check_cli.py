#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar-check behaviour: exit status and what it prints, for described and discovered topologies; then the command
line of all three tools (fiar-check, fiar-demo, fiar-bench): --help, --version, one usage exit status (2) and one short
line on stderr for every usage error, no message printed twice.

usage: check_cli.py FIAR_CHECK [FIAR_DEMO FIAR_BENCH] (the other two default to fiar-check's siblings)"""
import os
import re
import subprocess
import sys

EXE = sys.argv[1]
TOOLS = {
    "fiar-check": EXE,
    "fiar-demo": sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(EXE), "fiar-demo"),
    "fiar-bench": sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(EXE), "fiar-bench"),
}
USAGE = 2  # the usage exit status of every tool

# (arguments, environment additions, expected exit status, regular expressions the output must match)
CASES = [
    (["--help"], {}, 0, [r"usage: fiar-check", r"--backend NAME", r"--version"]),
    (["--version"], {}, 0, [r"^fiar-check \d+\.\d+\.\d+\n$"]),
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
    # Usage errors: exit 2, like fiar-demo's and fiar-bench's (the same status as a rejected choice).
    (["--nodes", "2"], {"FIAR_ALLREDUCE_BACKEND": "nvls"}, USAGE, [r"FIAR_ALLREDUCE_BACKEND='nvls'"]),
    (["--backend", "tensorrt"], {}, USAGE, [r"unknown all-reduce backend 'tensorrt'"]),
    (["--nodes"], {}, USAGE, [r"--nodes needs a value"]),
    (["--nodes", "0"], {}, USAGE, [r"--nodes '0': expected an integer >= 1"]),
    (["--nodes", "two"], {}, USAGE, [r"expected an integer"]),
    (["--multicast", "maybe"], {}, USAGE, [r"expected yes or no"]),
    (["--arch", "hopper"], {}, USAGE, [r"expected an architecture"]),
    (["--frobnicate", "1"], {}, USAGE, [r"unknown option '--frobnicate'"]),
    (["--nodes", "4", "--world-size", "2"], {}, USAGE, [r"malformed topology: node_count = 4"]),
    (["--nodes", "2", "--gpus-per-node", "8", "--world-size", "12"], {}, USAGE, [r"contradicts"]),
    (["--rank", "8"], {}, USAGE, [r"malformed topology: rank = 8"]),
    (["--nodes", "2", "--gpus-per-node"], {}, USAGE, [r"--gpus-per-node needs a value"]),
    (["--nodes", "--gpus-per-node", "8"], {}, USAGE, [r"--nodes needs a value"]),
    (["--nodes", "2", "stray"], {}, USAGE, [r"unexpected argument 'stray'"]),
    (["--nodes=2", "--gpus-per-node=8", "--multicast=maybe"], {}, USAGE, [r"--multicast 'maybe': expected yes or no"]),
    # Discovery on this machine (with or without a GPU) always yields a valid choice.
    ([], {}, 0, [r"topology \(discovered: \d+ in-process rank", r"choice: (mnnvl|trtllm|nccl)"]),
]


# Per tool: valid arguments that start with a flag and its value (a misspelt flag goes before, after that pair, and
# last), and a bad value with the text the message must quote.
TOOL_ARGS = {
    "fiar-check": {"valid": ["--nodes", "2", "--gpus-per-node", "8"], "bad_value": (["--gpus-per-node", "eight"], "'eight'")},
    "fiar-demo": {"valid": ["--platform", "host", "--tokens", "5"], "bad_value": (["--dtype", "fp9"], "'fp9'")},
    "fiar-bench": {"valid": ["--tokens", "1,2", "--plan"], "bad_value": (["--tokens", "1,x,4"], "'x'")},
}
MISSPELT = "--tokns"


def run_tool(tool, args, env_add=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FIAR_ALLREDUCE_BACKEND", "FIAR_NODE_ID", "FIAR_LOG_LEVEL")}
    env.update(env_add or {})
    return subprocess.run([TOOLS[tool]] + args, env=env, capture_output=True, text=True, timeout=120)


def printed_twice(text):
    """The lines of `text` (ignoring indentation and empty lines) that appear more than once."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return sorted({line for line in lines if lines.count(line) > 1})


def cli_problems():
    """(label, problem) for every command-line rule a tool breaks."""
    out = []
    for tool, spec in TOOL_ARGS.items():
        if not os.path.exists(TOOLS[tool]):
            out.append((tool, f"{TOOLS[tool]} does not exist"))
            continue

        def check(args, want_rc, stdout_res=(), stderr_res=(), usage_error=False):
            p = run_tool(tool, args)
            label = f"{tool} {' '.join(args)}"
            problems = []
            if p.returncode != want_rc:
                problems.append(f"exit status {p.returncode}, expected {want_rc}")
            problems += [f"stdout lacks /{r}/" for r in stdout_res if not re.search(r, p.stdout)]
            problems += [f"stderr lacks /{r}/" for r in stderr_res if not re.search(r, p.stderr)]
            if usage_error:
                if len(p.stderr.splitlines()) > 2:
                    problems.append(f"{len(p.stderr.splitlines())} lines on stderr, expected one short message")
                if re.search(r"(?i)usage:|options:", p.stderr):
                    problems.append("the usage text is printed with the error")
                if p.stdout:
                    problems.append("a usage error printed on stdout")
            if re.search(r"fiar-(check|demo|bench): fiar:", p.stdout + p.stderr):
                problems.append("a doubled prefix ('<tool>: fiar:')")
            if printed_twice(p.stdout + "\n" + p.stderr):
                problems.append(f"printed twice: {printed_twice(p.stdout + chr(10) + p.stderr)}")
            out.extend((label, f"{pr}\n--- stdout:\n{p.stdout}--- stderr:\n{p.stderr}") for pr in problems)
            if not problems:
                print(f"ok: {label} -> {p.returncode}")

        valid = spec["valid"]
        check(["--help"], 0, stdout_res=[r"usage", r"--version", r"exit status"])
        check(["-h"], 0, stdout_res=[r"usage"])
        check(["--version"], 0, stdout_res=[r"^%s \d+\.\d+\.\d+\n$" % tool])
        unknown = r"^%s: unknown option '%s'" % (tool, MISSPELT)
        for args in ([MISSPELT, "3"] + valid, valid[:2] + [MISSPELT, "3"] + valid[2:], valid + [MISSPELT],
                     valid + [MISSPELT + "=3"]):
            check(args, USAGE, stderr_res=[unknown, r"--help"], usage_error=True)
        check(valid + ["stray"], USAGE, stderr_res=[r"unexpected argument 'stray'"], usage_error=True)
        check(valid + [valid[0]], USAGE, stderr_res=[r"^%s: %s needs a value" % (tool, valid[0])], usage_error=True)
        check([valid[0]] + valid, USAGE, stderr_res=[r"^%s: %s needs a value" % (tool, valid[0])], usage_error=True)
        bad_args, named = spec["bad_value"]
        check(valid + bad_args, USAGE, stderr_res=[re.escape(bad_args[0]) + ".*" + re.escape(named)], usage_error=True)
        check(valid + ["=".join(bad_args)], USAGE, stderr_res=[re.escape(named)], usage_error=True)
        # fiar's own errors keep their one prefix.
        check(valid + ["--backend", "tensorrt"], USAGE, stderr_res=[r"^fiar: unknown all-reduce backend 'tensorrt'"],
              usage_error=True)
    return out


def main() -> int:
    failures = 0
    for args, env_add, want_rc, patterns in CASES:
        env = {k: v for k, v in os.environ.items()
               if k not in ("FIAR_ALLREDUCE_BACKEND", "FIAR_NODE_ID", "FIAR_LOG_LEVEL")}
        env.update(env_add)
        p = subprocess.run([EXE] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
        problems = []
        if p.returncode != want_rc:
            problems.append(f"exit status {p.returncode}, expected {want_rc}")
        problems += [f"no match for /{pat}/" for pat in patterns if not re.search(pat, p.stdout)]
        if re.search(r"fiar-check: fiar:", p.stdout):
            problems.append("a doubled prefix ('fiar-check: fiar:')")
        if printed_twice(p.stdout):
            problems.append(f"printed twice: {printed_twice(p.stdout)}")
        label = " ".join(args) + (f" (env {env_add})" if env_add else "")
        if problems:
            failures += 1
            print(f"FAIL: fiar-check {label}: " + "; ".join(problems) + "\n" + p.stdout)
        else:
            print(f"ok: fiar-check {label} -> {p.returncode}")
    print(f"{len(CASES) - failures} of {len(CASES)} fiar-check cases passed")
    problems = cli_problems()
    for label, problem in problems:
        print(f"FAIL: {label}: {problem}")
    print(f"command lines of the three tools: {len(problems)} problem(s)")
    return 1 if failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())
