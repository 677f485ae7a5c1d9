// fiar/fiar.cuh — the one header nvcc translation units include: everything in <fiar/fiar.hpp> plus the
// CUDA kernels and CudaPlatform::launch.
// Contract: a program that uses CudaPlatform compiles at least one translation unit that includes this
// header and uses (or explicitly instantiates) each Workspace<Policy, T, CudaPlatform> it needs.
#pragma once

#include "cuda/device_ctx.cuh"
#include "cuda/kernels.cuh"
#include "cuda/epilogue_kernel.cuh"
#include "fiar.hpp"
