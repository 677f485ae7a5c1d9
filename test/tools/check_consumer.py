#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A Meson consumer of fiar, built as the README says: fiar as a subproject, the dependency's cuda_gencode variable
as the consumer's -gencode flags, a .cu file that includes <fiar/fiar.cuh>. It must configure, compile and run;
without the flags it must fail at fiar's architecture #error (so the flags are what made it compile).

  check_consumer.py SOURCE_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1])
PROJECT = os.path.join(ROOT, "test", "consumer", "meson")


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout


def build(tmp, meson_build):
    src = os.path.join(tmp, "src")
    shutil.copytree(PROJECT, src)
    with open(os.path.join(src, "meson.build"), "w", encoding="utf-8") as f:
        f.write(meson_build)
    os.makedirs(os.path.join(src, "subprojects"))
    os.symlink(ROOT, os.path.join(src, "subprojects", "fiar"))
    rc, out = run(["meson", "setup", "build", "-Dfiar:gpu_archs=90a"], src)  # one architecture is enough here
    if rc != 0:
        return rc, out
    rc, more = run(["meson", "compile", "-C", "build"], src)
    return rc, out + more


def main() -> int:
    with open(os.path.join(PROJECT, "meson.build"), encoding="utf-8") as f:
        recipe = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = build(os.path.join(tmp, "with"), recipe)
        if rc != 0:
            print(f"FAIL: the README's consumer recipe does not build:\n{out}")
            return 1
        rc, ran = run([os.path.join(tmp, "with", "src", "build", "consumer")], tmp)
        if rc != 0 or "consumer: fiar" not in ran:
            print(f"FAIL: the consumer did not run:\n{ran}")
            return 1
        without = "\n".join(line for line in recipe.splitlines() if "cuda_gencode" not in line) + "\n"
        rc, out = build(os.path.join(tmp, "without"), without)
        if rc == 0:
            print("FAIL: without fiar's -gencode flags the consumer compiled for nvcc's default architecture")
            return 1
        if "older than sm_90" not in out:
            print(f"FAIL: without the flags the build failed, but not at fiar's architecture check:\n{out}")
            return 1
    print("ok: the consumer builds and runs with fiar_dep's cuda_gencode, and stops at fiar's #error without it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
