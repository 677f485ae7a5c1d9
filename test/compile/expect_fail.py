#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Expected-compile-failure tests.

  expect_fail.py --compiler NAME --source CASE -- CMD...
      CASE must fail to compile with CMD, and the diagnostics must match the regular expression on its
      "// expect-NAME:" line (or "// expect:" when there is no compiler-specific line).
  expect_fail.py --compiler NAME --source CASE --with-twin -- CMD...
      as above, after its valid twin (CASE with -DFIAR_EXPECT_OK) compiled with CMD.
  expect_fail.py --compiler NAME --twins CASE... -- CMD...
      the valid twins of all CASEs, in one translation unit (each case in a namespace of its own, -DFIAR_EXPECT_OK):
      it must compile, so a broken include path or a typo cannot pass for an expected failure. One compile for all
      cases keeps the suite fast; the failing compiles stop early, in the front end.
Exit 0 when that holds, 1 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


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


def twins(cmd, sources) -> int:
    with tempfile.TemporaryDirectory() as d:
        tu = os.path.join(d, "twins.cpp")
        with open(tu, "w", encoding="utf-8") as f:
            f.write("#include <fiar/fiar.hpp>\n#include <type_traits>\n")
            for i, s in enumerate(sources):
                f.write(f"namespace fiar_case_{i} {{\n#include \"{os.path.abspath(s)}\"\n}}\n")
        rc, out = compile_(cmd, tu, ["-DFIAR_EXPECT_OK"])
    if rc != 0:
        print(f"FAIL: the valid twins of {len(sources)} cases do not compile together:\n{out}")
        return 1
    print(f"ok: the valid twins of {len(sources)} cases compile")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--source")
    ap.add_argument("--with-twin", action="store_true")
    ap.add_argument("--twins", nargs="+")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = [c for c in a.cmd if c != "--"]
    if a.twins:
        return twins(cmd, a.twins)
    pattern = expectation(a.source, a.compiler)
    if a.with_twin:
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
