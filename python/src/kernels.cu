// SPDX-License-Identifier: Apache-2.0
// The Python extension's one nvcc translation unit (a CUDA build: python/CMakeLists.txt): the launches of every fiar
// kernel, so that module.cpp, plain C++, can run workspaces on CudaPlatform.
#include <fiar/instantiate.cuh>
