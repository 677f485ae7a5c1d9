# SPDX-License-Identifier: Apache-2.0
"""fiar's PEP 517 backend: scikit-build-core's, plus the CUDA headers from PyPI for a build without nvcc.

The host-emulator extension (FIAR_PYTHON_CUDA=0, or no nvcc found) includes the CUDA runtime's and CCCL's headers but
compiles no device code. So that such a build needs a C++20 compiler alone, this backend asks pip for NVIDIA's header
wheels (nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl: about 7 MB) whenever it builds without nvcc;
python/CMakeLists.txt then takes its headers from them. A build with nvcc uses the toolkit's headers (they must match
the compiler) and asks for nothing more.
"""
from __future__ import annotations

import os
import shutil

from scikit_build_core.build import *  # noqa: F401,F403 - every hook; the two below are extended
from scikit_build_core.build import get_requires_for_build_editable as _editable_requires
from scikit_build_core.build import get_requires_for_build_wheel as _wheel_requires

#: The CUDA 13 headers fiar's host code includes, as PyPI wheels (versions of the CUDA 13 toolkit fiar supports).
CUDA_HEADER_WHEELS = ["nvidia-cuda-runtime>=13,<14", "nvidia-cuda-crt>=13,<14", "nvidia-cuda-cccl>=13,<14"]


def builds_without_nvcc() -> bool:
    """Whether python/CMakeLists.txt will build the emulator-only extension (its rule for FIAR_PYTHON_CUDA)."""
    want = os.environ.get("FIAR_PYTHON_CUDA", "")
    if want in ("0", "1"):
        return want == "0"
    cudacxx = os.environ.get("CUDACXX", "")
    return not ((cudacxx and os.path.exists(cudacxx)) or shutil.which("nvcc"))


def get_requires_for_build_wheel(config_settings=None):  # noqa: D103 - PEP 517's hook
    return _wheel_requires(config_settings) + (CUDA_HEADER_WHEELS if builds_without_nvcc() else [])


def get_requires_for_build_editable(config_settings=None):  # noqa: D103
    return _editable_requires(config_settings) + (CUDA_HEADER_WHEELS if builds_without_nvcc() else [])
