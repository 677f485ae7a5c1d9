#!/usr/bin/env python3
"""Expected-compile-failure test.

Compiles SOURCE twice with the given compiler command:
  1. with -DFIAR_EXPECT_OK: the valid twin of the case must compile (so a broken include path or a typo
     cannot pass for the expected failure);
  2. without it: compilation must fail, and the diagnostics must match the regular expression given on the
     source's "// expect-<compiler>:" line (or "// expect:" when there is no compiler-specific line).
Exit 0 when both hold, 1 otherwise.
"""
import argparse
import re
import subprocess
import sys


def expectation(source: str, compiler: str) -> str:
    generic = None
    with open(source, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*//\s*expect(-[\w+]+)?:\s*(.+?)\s*$", line)
            if not m:
                continue
            if m.group(1) == "-" + compiler:
                return m.group(2)
            if m.group(1) is None:
                generic = m.group(2)
    if generic is None:
        sys.exit(f"{source}: no '// expect:' line")
    return generic


def compile_(cmd, source, extra):
    p = subprocess.run(cmd + extra + [source], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = [c for c in a.cmd if c != "--"]
    pattern = expectation(a.source, a.compiler)

    rc, out = compile_(cmd, a.source, ["-DFIAR_EXPECT_OK"])
    if rc != 0:
        print(f"FAIL: the valid twin of {a.source} does not compile:\n{out}")
        return 1
    rc, out = compile_(cmd, a.source, [])
    if rc == 0:
        print(f"FAIL: {a.source} compiled, but it must not")
        return 1
    if not re.search(pattern, out):
        print(f"FAIL: {a.source} failed to compile, but not with /{pattern}/:\n{out}")
        return 1
    print(f"ok: {a.compiler} rejects {a.source} with /{pattern}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
