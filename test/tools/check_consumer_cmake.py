#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CMake consumers of fiar, built as the README says, each configured, compiled (an nvcc and a g++ translation unit)
and run: fiar by add_subdirectory from the checkout, by FetchContent from its git repository (the checkout's HEAD),
and by find_package(fiar CONFIG) from a `cmake --install` prefix, whose package must hold no path of the toolkit, and
from a `meson install` prefix.

  check_consumer_cmake.py SOURCE_ROOT
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1])
PROJECT = os.path.join(ROOT, "test", "consumer", "cmake")
ARCH = ["-DFIAR_CUDA_ARCHITECTURES=90a"]  # one architecture is enough here


def run(cmd, cwd, path=None):
    env = dict(os.environ, PATH=path) if path else None
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    return p.returncode, p.stdout


def consumer(tmp, name, defines):
    build = os.path.join(tmp, name)
    for cmd in (["cmake", "-S", PROJECT, "-B", build, "-G", "Ninja"] + ARCH + defines,
                ["cmake", "--build", build], [os.path.join(build, "consumer")]):
        rc, out = run(cmd, tmp)
        if rc != 0:
            return f"FAIL ({name}): {' '.join(cmd)} exited {rc}:\n{out}"
    if "all-reduce ok" not in out:
        return f"FAIL ({name}): the consumer ran but did not report its all-reduce:\n{out}"
    return ""


def main() -> int:
    cmake = shutil.which("cmake")
    version = re.search(r"(\d+)\.(\d+)", run([cmake, "--version"], ROOT)[1]) if cmake else None
    if not version or (int(version.group(1)), int(version.group(2))) < (3, 25):
        print("SKIP: CMake 3.25 or newer is not installed")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        failures.append(consumer(tmp, "subdirectory", [f"-DFIAR_SOURCE_DIR={ROOT}"]))
        if os.path.isdir(os.path.join(ROOT, ".git")):
            rc, head = run(["git", "rev-parse", "HEAD"], ROOT)
            failures.append(consumer(tmp, "fetchcontent", [f"-DFIAR_GIT_REPOSITORY=file://{ROOT}",
                                                           f"-DFIAR_GIT_TAG={head.strip()}"]) if rc == 0 else "")
        prefix = os.path.join(tmp, "prefix")
        for cmd in (["cmake", "-S", ROOT, "-B", os.path.join(tmp, "fiar"), "-G", "Ninja"],
                    ["cmake", "--install", os.path.join(tmp, "fiar"), "--prefix", prefix]):
            rc, out = run(cmd, tmp)
            if rc != 0:
                failures.append(f"FAIL (install): {' '.join(cmd)} exited {rc}:\n{out}")
                break
        else:
            targets = os.path.join(prefix, "share", "cmake", "fiar", "fiarTargets.cmake")
            text = open(targets, encoding="utf-8").read()
            if "/cuda" in text or "nccl" in text:
                failures.append(f"FAIL (install): {targets} holds toolkit paths:\n{text}")
            failures.append(consumer(tmp, "find_package", [f"-DCMAKE_PREFIX_PATH={prefix}"]))
        # The same package from a `meson install` prefix (Meson's configure needs nvcc: the one CMake uses).
        meson_prefix = os.path.join(tmp, "meson-prefix")
        nvcc = os.environ.get("CUDACXX", "nvcc")
        env_path = os.path.dirname(nvcc) + os.pathsep + os.environ.get("PATH", "") if os.path.isabs(nvcc) else None
        for cmd in (["meson", "setup", os.path.join(tmp, "meson-build"), ROOT, f"--prefix={meson_prefix}",
                     "-Dtests=disabled", "-Dexamples=disabled"],
                    ["meson", "install", "-C", os.path.join(tmp, "meson-build")]):
            rc, out = run(cmd, tmp, env_path)
            if rc != 0:
                failures.append(f"FAIL (meson install): {' '.join(cmd)} exited {rc}:\n{out}")
                break
        else:
            failures.append(consumer(tmp, "find_package-meson", [f"-DCMAKE_PREFIX_PATH={meson_prefix}"]))
            # Both prefixes hold the same pkg-config file (its prefix line aside).
            def pc_fields(root):
                path = os.path.join(root, "share", "pkgconfig", "fiar.pc")
                if not os.path.exists(path):
                    return None
                return sorted(line.strip() for line in open(path, encoding="utf-8")
                              if line.strip() and not line.startswith(("prefix=", "libdir=")))
            cmake_pc, meson_pc = pc_fields(prefix), pc_fields(meson_prefix)
            if cmake_pc is None:
                failures.append(f"FAIL (install): cmake --install wrote no share/pkgconfig/fiar.pc under {prefix}")
            elif cmake_pc != meson_pc:
                failures.append(f"FAIL (install): the fiar.pc of cmake --install differs from meson install's:\n"
                                f"{cmake_pc}\n{meson_pc}")
    failures = [f for f in failures if f]
    if failures:
        print("\n".join(failures))
        return 1
    print("ok: CMake consumers by add_subdirectory, FetchContent and find_package (cmake --install and meson install "
          "prefixes) build and run; both prefixes hold the same fiar.pc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
