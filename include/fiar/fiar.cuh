// SPDX-License-Identifier: Apache-2.0
// fiar/fiar.cuh — the kernel side of fiar for nvcc translation units: DeviceCtx, the one __global__ template
// (exec/device_kernel.cuh), every algo/ operation, and the core/ values they use; none of the host library.
// Contract: including it emits nothing by itself and parses none of the host layers (runtime/, comm/, platform/,
// backend/, the emulator); a TU that creates workspaces also includes <fiar/fiar.hpp> (in either order), and
// <fiar/instantiate.cuh> (which includes both, with CudaPlatform::launch's definition) emits the launches of every fiar
// operation. Device code is refused below sm_90 (exec/device_ctx.cuh names the -gencode fix).
#pragma once

#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/pattern.hpp"
#include "core/prelude.hpp"
#include "core/version.hpp"

#include "exec/context.hpp"
#include "exec/device_ctx.cuh"
#include "exec/device_kernel.cuh"
#include "exec/operation.hpp"
#include "exec/vec.hpp"

#include "algo/convert.hpp"
#include "algo/epilogue.hpp"
#include "algo/epilogue_pass.hpp"
#include "algo/lamport.hpp"
#include "algo/multimem.hpp"
#include "algo/quant.hpp"
#include "algo/user_epilogue.hpp"
