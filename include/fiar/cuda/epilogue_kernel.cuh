// fiar/cuda/epilogue_kernel.cuh — the nccl backend's epilogue kernel (a thin __global__ shell over
// algo::epilogue_pass) and its launch, cuda_detail::launch_epilogue_pass (declared in <fiar/nccl.hpp>).
// Contract: hidden visibility; the launch shape of the Lamport kernels (one block per token up to the cap,
// threads covering a token's vectors); PDL wait before reading the sum, successor released at the very end.
#pragma once

#if !defined(__CUDACC__)
#error "fiar/cuda/epilogue_kernel.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

#include <cuda_runtime.h>

#include <string>

#include "../algo/epilogue_pass.hpp"
#include "../detail/cuda_check.hpp"
#include "../dtype.hpp"
#include "../nccl.hpp"
#include "../platform_cuda.hpp"
#include "device_ctx.cuh"
#include "kernels.cuh"

namespace fiar::inline v0_1::cuda_detail {

/// The fused epilogue over an already reduced sum (the nccl backend runs it after ncclAllReduce). The
/// parameters stay in the constant bank (__grid_constant__).
template <Pattern P, ReduceType T>
__global__ __attribute__((visibility("hidden"))) void __launch_bounds__(kMaxThreads)
    epilogue_pass_kernel(const __grid_constant__ algo::EpiloguePassParams<T> p) {
  wait_for_predecessor();
  DeviceCtx ctx;
  algo::epilogue_pass<P, T>(ctx, p);
  allow_successor();
}

template <Pattern P, ReduceType T>
void launch_epilogue_pass(const CudaPlatform& platform, const algo::EpiloguePassParams<T>& p, cudaStream_t stream) {
  // With PDL the predecessor is NCCL's kernel, which never triggers early: the wait in the kernel then waits
  // for its completion, and only the launch latency overlaps.
  launch_kernel<P, T>(epilogue_pass_kernel<P, T>, p, platform.launch_shape(p.num_tokens, p.vecs_per_token), stream,
                      platform.pdl(), platform.device(), "nccl epilogue");
}

}  // namespace fiar::inline v0_1::cuda_detail
