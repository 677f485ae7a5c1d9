// SPDX-License-Identifier: Apache-2.0
// fiar/exec/device_kernel.cuh — the one __global__ template alone: kernel<Op> runs any Operation on the GPU (its host
// launch, launch_on_stream<Op>, is in exec/kernel.cuh).
// Contract: hidden visibility (shared objects never swap kernels); the kernel waits for the stream's previous work
// (griddepcontrol.wait) before it runs and releases its successor only at the very end; no host code, so a kernel's
// translation unit parses none of the host library.
#pragma once

#if !defined(__CUDACC__)
#error "fiar/exec/device_kernel.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

#include <cuda_runtime.h>

#include "../core/prelude.hpp"
#include "device_ctx.cuh"
#include "operation.hpp"

// Everything here is hidden: a shared object that includes fiar launches its own kernels, never another object's.
#pragma GCC visibility push(hidden)
FIAR_BEGIN_NAMESPACE
namespace detail {
// Waits until the previous kernel of the stream has finished (programmatic dependent launch): nothing of ours may
// read the caller's input, or the workspace, before that.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__)
  cudaGridDependencySynchronize();
#endif
}

// Lets the next kernel of the stream launch. Only at the very end: triggering before the output is written let the
// consumer read stale results (NaNs in vLLM's one-shot path, vLLM #45448).
__device__ __forceinline__ void allow_successor() {
#if defined(__CUDA_ARCH__)
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
}  // namespace detail

namespace exec {

/// Every fiar kernel. The parameters stay in the constant bank (__grid_constant__), so the operation takes them by
/// reference without a local copy.
template <Operation Op>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(Op::max_threads, Op::min_blocks_per_sm)
    kernel(const __grid_constant__ typename Op::Params p) {
#if defined(__CUDA_ARCH__)
  if constexpr (min_arch_of<Op> * 10 > __CUDA_ARCH__) {
    // Built for an architecture the operation does not run on (NVFP4 below sm_100: exec::min_arch_of): the host rejects
    // the call before any launch, so this body is never reached; no code for it, and a trap if it ever is.
    __trap();
  } else
#endif
  {
    detail::wait_for_predecessor();
    DeviceCtx ctx;
    Op::run(ctx, p);
    detail::allow_successor();
  }
}

}  // namespace exec
FIAR_END_NAMESPACE
#pragma GCC visibility pop
