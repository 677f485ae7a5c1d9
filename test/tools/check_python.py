#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar's Python package, as a user installs it: a virtual environment (reused while the package's sources are
unchanged) with numpy, pytest, ml_dtypes and torch, `FIAR_PYTHON_CUDA=0 pip install .` from the checkout (build
isolation: pip fetches the build's packages, NVIDIA's CUDA header wheels among them, so the toolkit is not used), then
its tests (test/python, pytest; test_torch.py and test_call_sites.py need torch, test_cuda.py is the GPU's and is
left out).

  check_python.py SOURCE_ROOT VENV_DIR [cuda]

cuda: the CUDA build instead (FIAR_PYTHON_CUDA=1 for 90a, with NCCL where found; no torch), whose host platform
must pass the same tests (test_fiar.py): the GPU glue compiles, links and loads without a driver. SKIP without nvcc.

Exit 77 (meson: SKIP) when pip cannot get the packages (no network, no index), when torch could not be installed
(FIAR_PYTHON_TORCH=0 skips it: about 2.5 GB), or when pytest skipped a test, and everything that ran passed: the
reason is printed.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import venv

ROOT, VENV = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
CUDA = sys.argv[3:] == ["cuda"]
PY = os.path.join(VENV, "bin", "python")
STAMP = os.path.join(VENV, "fiar-installed.stamp")
TEST_DEPS = ["numpy", "pytest", "ml_dtypes"]


def newest_source():
    newest = os.path.getmtime(os.path.join(ROOT, "pyproject.toml"))
    for top in ("python", os.path.join("include", "fiar")):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                newest = max(newest, os.path.getmtime(os.path.join(d, f)))
    return newest


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kw)


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


started = time.monotonic()
if CUDA and shutil.which(os.environ.get("CUDACXX") or "nvcc") is None:
    skip("no nvcc on PATH (or CUDACXX): the CUDA build of the package needs the CUDA toolkit")
if shutil.which("cmake") is None:
    skip("no cmake on PATH: the package's build needs CMake 3.25 (apt-get install cmake)")
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    skip("no Python.h for " + sys.executable + ": the extension needs Python's headers (apt-get install python3-dev)")
if not os.path.exists(PY):
    try:
        venv.EnvBuilder(with_pip=True).create(VENV)
    except Exception as e:  # noqa: BLE001 - e.g. Debian's python3 without python3-venv
        shutil.rmtree(VENV, ignore_errors=True)
        skip(f"cannot create a virtual environment with pip ({e}): apt-get install python3-venv")
DEPS_STAMP = os.path.join(VENV, "deps.stamp")  # holds the list it was made for: a changed list installs again
if not os.path.exists(DEPS_STAMP) or open(DEPS_STAMP).read() != " ".join(TEST_DEPS):
    p = run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + TEST_DEPS, capture_output=True,
            text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        skip("pip could not install the tests' packages (" + ", ".join(TEST_DEPS) +
             "): no package index reachable from here?")
    with open(DEPS_STAMP, "w") as f:
        f.write(" ".join(TEST_DEPS))
no_torch = ""
if CUDA:
    no_torch = "the CUDA build's test runs without torch"
elif os.environ.get("FIAR_PYTHON_TORCH") == "0":
    no_torch = "FIAR_PYTHON_TORCH=0"
elif not os.path.exists(os.path.join(VENV, "torch.stamp")):
    p = run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check", "torch"], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-5000:] + p.stderr[-5000:])
        no_torch = "pip could not install torch"
    else:
        open(os.path.join(VENV, "torch.stamp"), "w").close()
if not os.path.exists(STAMP) or os.path.getmtime(STAMP) < newest_source():
    env = {k: v for k, v in os.environ.items() if k not in ("FIAR_CUDA_HEADERS", "FIAR_PYTHON_NCCL")}
    env["FIAR_PYTHON_CUDA"] = "1" if CUDA else "0"
    if CUDA:
        env["FIAR_CUDA_ARCHITECTURES"] = "90a"
    p = run([PY, "-m", "pip", "install", "--disable-pip-version-check", "--force-reinstall", "--no-deps", ROOT],
            env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-20000:] + p.stderr[-20000:])
        if "Could not find a version" in p.stderr or "No matching distribution" in p.stderr:
            skip("pip could not fetch the package's build dependencies: no package index reachable from here?")
        print(f"FAIL: FIAR_PYTHON_CUDA={env['FIAR_PYTHON_CUDA']} pip install . failed")
        sys.exit(1)
    open(STAMP, "w").close()
# The emulator build needs a C++20 compiler alone: its CUDA headers came from NVIDIA's wheels, not the toolkit. The
# CUDA build uses the toolkit's.
p = run([PY, "-c", "import fiar._fiar as f; print(f.cuda, f.cuda_headers, f.nccl)"], capture_output=True, text=True,
        cwd=VENV)
if p.stdout.split()[:2] != (["True", "toolkit"] if CUDA else ["False", "wheels"]):
    print(p.stdout + p.stderr)
    print("FAIL: the CUDA build takes the toolkit's headers, the emulator build NVIDIA's wheels' (build_backend)")
    sys.exit(1)
print("check_python: fiar._fiar.cuda, .cuda_headers, .nccl = " + " ".join(p.stdout.split()), flush=True)
print(f"check_python: package installed ({time.monotonic() - started:.0f} s)", flush=True)
# test_cuda.py is the GPU's (scripts/gpu-check runs it); test_torch.py and test_call_sites.py need torch.
tests = os.path.join(ROOT, "test", "python")
ignored = ["test_cuda.py"] + (["test_torch.py", "test_call_sites.py"] if no_torch else [])
p = run([PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", tests] +
        [a for name in ignored for a in ("--ignore", os.path.join(tests, name))], cwd=VENV, capture_output=True,
        text=True)
print(p.stdout + p.stderr, flush=True)
if p.returncode == 0 and no_torch and not CUDA:
    skip(f"every test but test_torch.py and test_call_sites.py passed; the torch tests did not run: {no_torch}")
skipped = re.search(r"(\d+) skipped", p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "")
if p.returncode == 0 and skipped:  # a pytest skip is not a pass: the reasons are printed above
    skip(f"the tests that ran passed, but {skipped.group(1)} were skipped")
sys.exit(p.returncode)
