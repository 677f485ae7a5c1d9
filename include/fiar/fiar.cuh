// SPDX-License-Identifier: Apache-2.0
// fiar/fiar.cuh — the header nvcc translation units include to define launches: everything in <fiar/fiar.hpp> plus
// the one __global__ template (exec/kernel.cuh) and CudaPlatform::launch's definition.
// Contract: including it emits nothing by itself; <fiar/instantiate.cuh> (which includes it) emits the launches of
// every fiar operation. Device code is refused below sm_90 (exec/device_ctx.cuh names the -gencode fix).
#pragma once

#include "exec/device_ctx.cuh"
#include "exec/kernel.cuh"
#include "fiar.hpp"
#include "platform/cuda_launch.cuh"
