# SPDX-License-Identifier: Apache-2.0
"""Prints the include directories of NVIDIA's CUDA 13 header wheels (nvidia-cuda-runtime, nvidia-cuda-crt,
nvidia-cuda-cccl) importable by this Python, as a CMake list; exits 1, printing nothing, unless they hold every
header fiar's host code needs. Run by python/CMakeLists.txt with the build's interpreter."""
import importlib.util
import os
import sys

NEEDED = ("cuda_runtime_api.h", os.path.join("crt", "host_config.h"), "cuda_bf16.h",
          os.path.join("cccl", "cuda", "std", "atomic"))

spec = importlib.util.find_spec("nvidia.cu13") if importlib.util.find_spec("nvidia") else None
roots = [os.path.join(p, "include") for p in (spec.submodule_search_locations or [])] if spec else []
found = [r for r in roots if os.path.isdir(r)]
if not found or not all(any(os.path.exists(os.path.join(r, h)) for r in found) for h in NEEDED):
    sys.exit(1)
print(";".join(found + [os.path.join(r, "cccl") for r in found if os.path.isdir(os.path.join(r, "cccl"))]))
