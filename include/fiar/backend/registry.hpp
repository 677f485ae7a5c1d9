// SPDX-License-Identifier: Apache-2.0
// fiar/backend/registry.hpp — every backend's header and every operation fiar launches on CudaPlatform, listed once,
// with their launch functions declared `extern template` for every pattern and element type.
// Contract: no translation unit instantiates CudaPlatform::launch<Op> implicitly; <fiar/instantiate.cuh> defines them
// all (or the subset its macros select) in one nvcc translation unit per linked module. A new backend adds its header
// and its FIAR_<NAME>_OPERATIONS here (and its policy to core/policy.hpp's BackendPolicies).
#pragma once

#include <cuda_runtime_api.h>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../platform/cuda.hpp"
#include "mnnvl.hpp"
#include "nccl.hpp"
#include "trtllm.hpp"

/// Calls X(Op) for every operation template of every backend.
#define FIAR_ALL_OPERATIONS(X) FIAR_TRTLLM_OPERATIONS(X) FIAR_MNNVL_OPERATIONS(X) FIAR_NCCL_OPERATIONS(X)
// X(args..., Op) for every operation template of every backend.
#define FIAR_DETAIL_ALL_OPERATIONS_WITH(X, ...)      \
  FIAR_DETAIL_TRTLLM_OPERATIONS_WITH(X, __VA_ARGS__) \
  FIAR_DETAIL_MNNVL_OPERATIONS_WITH(X, __VA_ARGS__) FIAR_DETAIL_NCCL_OPERATIONS_WITH(X, __VA_ARGS__)

// `Prefix template void CudaPlatform::launch<Op<P, T>>(...);` for one operation, pattern and element type, and the
// products over every pattern and over a list of element types (FIAR_FOR_EACH_DTYPE or a subset of it).
#define FIAR_DETAIL_LAUNCH(Prefix, Op, T, P)                                            \
  Prefix template void ::fiar::CudaPlatform::launch<::fiar::Op<::fiar::Pattern::P, T>>( \
      const ::fiar::Op<::fiar::Pattern::P, T>::Params&, cudaStream_t);
#define FIAR_DETAIL_LAUNCHES_OF_DTYPE(Prefix, Op, T) FIAR_FOR_EACH_PATTERN(FIAR_DETAIL_LAUNCH, Prefix, Op, T)
#define FIAR_DETAIL_EXTERN_LAUNCHES(Op) FIAR_FOR_EACH_DTYPE(FIAR_DETAIL_LAUNCHES_OF_DTYPE, extern, Op)

FIAR_ALL_OPERATIONS(FIAR_DETAIL_EXTERN_LAUNCHES)
