// SPDX-License-Identifier: Apache-2.0
// fiar/platform/cuda_launch.cuh — the definition of CudaPlatform::launch<Op> (nvcc only).
// Contract: included through <fiar/instantiate.cuh>; host headers declare every fiar operation's launch
// `extern template`, so it is emitted only where <fiar/instantiate.cuh> instantiates it explicitly (one nvcc
// translation unit per linked module).
#pragma once

#if !defined(__CUDACC__)
#error "fiar/platform/cuda_launch.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

#include "../core/prelude.hpp"
#include "../exec/kernel.cuh"
#include "../exec/operation.hpp"
#include "cuda.hpp"

FIAR_BEGIN_NAMESPACE

// The grid is Op's for this platform's limits. By default at most the SM count divided by the ranks of the group on
// this GPU: ranks that share a GPU must be resident at the same time, or a Lamport kernel spinning on every SM starves
// its peer's kernel, which never starts, and both wait until the timeout.
template <exec::Operation Op>
void CudaPlatform::launch(const typename Op::Params& p, cudaStream_t stream) {
  require_ready();
  exec::launch_on_stream<Op>(p, Op::shape(p, limits()), stream, pdl(), device_);
}

FIAR_END_NAMESPACE
