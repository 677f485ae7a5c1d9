// fiar/cuda/kernels.cuh — the Lamport kernels of trtllm and mnnvl (thin __global__ shells over algo/) and
// CudaPlatform::launch.
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
  algo::lamport_oneshot<P, T, algo::Transport::Unicast>(ctx, p);
  allow_successor();
}

/// Lamport two-shot (algo::lamport_twoshot): reduce-scatter, then all-gather, bit-identical to one-shot.
template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads)
    lamport_twoshot_kernel(const __grid_constant__ algo::LamportParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::lamport_twoshot<P, T, algo::Transport::Unicast>(ctx, p);
  allow_successor();
}

// The mnnvl kernels: the same protocols with the multicast transport (algo::Transport::Multicast), named
// apart so that profiles show the backend. Their launch bounds also promise one resident block per SM: with
// ptxas's default heuristics the two-shot half/bf16 kernel spilled on sm_90a (scripts/ctx-cost checks it).
template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads, 1)
    mnnvl_oneshot_kernel(const __grid_constant__ algo::LamportParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::lamport_oneshot<P, T, algo::Transport::Multicast>(ctx, p);
  allow_successor();
}

template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads, 1)
    mnnvl_twoshot_kernel(const __grid_constant__ algo::LamportParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::lamport_twoshot<P, T, algo::Transport::Multicast>(ctx, p);
  allow_successor();
}

/// Launches kernel(p) on `stream` with `shape` (device `device` current), with programmatic dependent launch
/// when `pdl` is set: every fiar launch (the Lamport kernels, the nccl epilogue). A failure throws
/// fiar::cuda_error naming `what` (the kernel's kind), P, T and the shape.
template <Pattern P, ReduceType T, class Params>
void launch_kernel(void (*kernel)(Params), const Params& p, const CudaLaunchShape& shape, cudaStream_t stream, bool pdl,
                   int device, const std::string& what) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(shape.blocks));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  if (pdl) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  detail::DeviceGuard guard(device);
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, p);
  detail::cuda_check(e,
                     "cudaLaunchKernelEx (" + what + ", " + std::string(to_string(P)) + ", " +
                         std::string(dtype_name<T>()) + ", " + std::to_string(shape.blocks) + " x " +
                         std::to_string(shape.threads) + " threads) on device " + std::to_string(device),
                     "the stream belongs to device " + std::to_string(device) +
                         ", the binary was built for this GPU's architecture (gpu_archs), and no earlier kernel "
                         "faulted");
}

}  // namespace fiar::inline v0_1::cuda_detail

namespace fiar::inline v0_1 {

// Grid: one block per token, at most max_blocks() blocks (a block loops over tokens beyond that). The
// default cap is the SM count divided by the ranks of the group on this GPU: ranks that share a GPU must be
// resident at the same time, or a Lamport kernel spinning on every SM starves its peer's kernel, which never
// starts, and both wait until the timeout.
template <Pattern P, ReduceType T, algo::Transport X>
void CudaPlatform::launch(Strategy s, const algo::LamportParams<T>& p, cudaStream_t stream) {
  require_ready();
  const CudaLaunchShape shape = launch_shape(p.num_tokens, p.vecs_per_token);
  const bool twoshot = s == Strategy::TwoShot;
  constexpr bool multicast = X == algo::Transport::Multicast;
  // Only the two kernels of this transport are instantiated.
  void (*kernel)(algo::LamportParams<T>);
  if constexpr (multicast) {
    kernel = twoshot ? cuda_detail::mnnvl_twoshot_kernel<P, T> : cuda_detail::mnnvl_oneshot_kernel<P, T>;
  } else {
    kernel = twoshot ? cuda_detail::lamport_twoshot_kernel<P, T> : cuda_detail::lamport_oneshot_kernel<P, T>;
  }
  cuda_detail::launch_kernel<P, T>(kernel, p, shape, stream, pdl(), device_,
                                   std::string(multicast ? "mnnvl " : "trtllm ") + (twoshot ? "two-shot" : "one-shot"));
}

}  // namespace fiar::inline v0_1
