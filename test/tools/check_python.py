#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fiar's Python package, as a user installs it: a virtual environment (reused while the package's sources are
unchanged), `FIAR_PYTHON_CUDA=0 pip install .` from the checkout, then its tests (test/python, pytest).

  check_python.py SOURCE_ROOT VENV_DIR

Exit 77 (meson: SKIP) when pip cannot get the build's packages (no network, no index): the reason is printed.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv

ROOT, VENV = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PY = os.path.join(VENV, "bin", "python")
STAMP = os.path.join(VENV, "fiar-installed.stamp")
BUILD_DEPS = ["scikit-build-core>=0.10", "nanobind>=2.4", "numpy", "pytest"]


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
if not os.path.exists(os.path.join(VENV, "deps.stamp")):
    p = run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + BUILD_DEPS, capture_output=True,
            text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        skip("pip could not install the package's build dependencies (" + ", ".join(BUILD_DEPS) +
             "): no package index reachable from here?")
    open(os.path.join(VENV, "deps.stamp"), "w").close()
if not os.path.exists(STAMP) or os.path.getmtime(STAMP) < newest_source():
    env = dict(os.environ, FIAR_PYTHON_CUDA="0")
    p = run([PY, "-m", "pip", "install", "--disable-pip-version-check", "--no-build-isolation", "--force-reinstall",
             "--no-deps", ROOT], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-20000:] + p.stderr[-20000:])
        print("FAIL: FIAR_PYTHON_CUDA=0 pip install . failed")
        sys.exit(1)
    open(STAMP, "w").close()
print(f"check_python: package installed ({time.monotonic() - started:.0f} s)", flush=True)
p = run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "test", "python")], cwd=VENV)
sys.exit(p.returncode)
