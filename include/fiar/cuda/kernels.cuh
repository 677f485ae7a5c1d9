// fiar/cuda/kernels.cuh — the trtllm kernels (thin __global__ shells over algo/) and CudaPlatform::launch.
// Contract: hidden visibility (shared objects never swap kernels); PDL wait first, successor released last;
// one kernel per dtype x strategy, world size being a runtime parameter.
#pragma once

#if !defined(__CUDACC__)
#error "fiar/cuda/kernels.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

#include <cuda_runtime.h>

#include <string>

#include "../algo/lamport.hpp"
#include "../detail/cuda_check.hpp"
#include "../dtype.hpp"
#include "../platform_cuda.hpp"
#include "device_ctx.cuh"

namespace fiar::inline v0_1::cuda_detail {

/// Threads per block the kernels are built for (CudaPlatform::launch_shape never asks for more).
inline constexpr int kMaxThreads = 1024;

// Waits until the previous kernel of the stream has finished (programmatic dependent launch): nothing of
// ours may read the caller's input, or the workspace, before that.
__device__ __forceinline__ void wait_for_predecessor() {
#if __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Lets the next kernel of the stream launch. Only at the very end: triggering before the output is
// written let the consumer read stale results (NaNs in vLLM's one-shot path, vLLM #45448).
__device__ __forceinline__ void allow_successor() {
#if __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// No thread-block clusters: each token is reduced by exactly one block (its lanes stride over the token's
// vectors), so no block needs another block's partial sums and there is no cross-block reduction to share
// through distributed shared memory. Blocks only meet through the state counter in finish_call().

/// Lamport one-shot (algo::lamport_oneshot). The parameters stay in the constant bank (__grid_constant__),
/// so the algo code can take them by reference without a local copy.
template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads)
    lamport_oneshot_kernel(const __grid_constant__ algo::LamportParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::lamport_oneshot<P, T>(ctx, p);
  allow_successor();
}

/// Lamport two-shot (algo::lamport_twoshot): reduce-scatter, then all-gather, bit-identical to one-shot.
template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads)
    lamport_twoshot_kernel(const __grid_constant__ algo::LamportParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::lamport_twoshot<P, T>(ctx, p);
  allow_successor();
}

}  // namespace fiar::inline v0_1::cuda_detail

namespace fiar::inline v0_1 {

// Grid: one block per token, at most max_blocks() blocks (a block loops over tokens beyond that). The
// default cap is the SM count divided by the ranks of the group on this GPU: ranks that share a GPU must be
// resident at the same time, or a Lamport kernel spinning on every SM starves its peer's kernel, which never
// starts, and both wait until the timeout.
template <Pattern P, ReduceType T>
void CudaPlatform::launch(Strategy s, const algo::LamportParams<T>& p, cudaStream_t stream) {
  require_ready();
  const CudaLaunchShape shape = launch_shape(p.num_tokens, p.vecs_per_token);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(shape.blocks));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  if (pdl()) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  detail::DeviceGuard guard(device_);
  const bool twoshot = s == Strategy::TwoShot;
  const cudaError_t e = twoshot ? cudaLaunchKernelEx(&config, cuda_detail::lamport_twoshot_kernel<P, T>, p)
                                : cudaLaunchKernelEx(&config, cuda_detail::lamport_oneshot_kernel<P, T>, p);
  detail::cuda_check(e,
                     std::string("cudaLaunchKernelEx (trtllm ") + (twoshot ? "two-shot" : "one-shot") + ", " +
                         to_string(P) + ", " +
                         std::string(dtype_name<T>()) + ", " + std::to_string(shape.blocks) + " x " +
                         std::to_string(shape.threads) + " threads) on device " + std::to_string(device_),
                     "the stream belongs to device " + std::to_string(device_) +
                         ", the binary was built for this GPU's architecture (gpu_archs), and no earlier kernel "
                         "faulted");
}

}  // namespace fiar::inline v0_1
