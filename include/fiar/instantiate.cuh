// SPDX-License-Identifier: Apache-2.0
// fiar/instantiate.cuh — defines CudaPlatform::launch for every fiar operation, pattern and element type: include it
// in exactly one nvcc translation unit of each linked module (executable or shared library) that runs on CudaPlatform.
// Contract: standard-conforming explicit instantiation definitions of what <fiar/fiar.hpp> declares `extern template`
// (backend/registry.hpp). Before including it, a translation unit may select a subset (to split the kernels over
// several translation units of one module, or to build fewer): define FIAR_INSTANTIATE_DTYPES(X, ...) as a sublist of
// FIAR_FOR_EACH_DTYPE, FIAR_INSTANTIATE_PATTERNS(X, ...) as a sublist of FIAR_FOR_EACH_PATTERN, and/or
// FIAR_INSTANTIATE_OPERATIONS(X) as a sublist of FIAR_ALL_OPERATIONS. Calling a launch no translation unit defines is
// a link error naming CudaPlatform::launch.
#pragma once

#include "fiar.cuh"
#include "fiar.hpp"
#include "platform/cuda_launch.cuh"

#if !defined(FIAR_INSTANTIATE_DTYPES)
#define FIAR_INSTANTIATE_DTYPES FIAR_FOR_EACH_DTYPE
#endif
#if !defined(FIAR_INSTANTIATE_PATTERNS)
#define FIAR_INSTANTIATE_PATTERNS FIAR_FOR_EACH_PATTERN
#endif
#if !defined(FIAR_INSTANTIATE_OPERATIONS)
#define FIAR_INSTANTIATE_OPERATIONS FIAR_ALL_OPERATIONS
#endif

#define FIAR_DETAIL_DEFINE_LAUNCHES_OF_DTYPE(Prefix, Op, T) FIAR_INSTANTIATE_PATTERNS(FIAR_DETAIL_LAUNCH, Prefix, Op, T)
#define FIAR_DETAIL_DEFINE_LAUNCHES(Op) FIAR_INSTANTIATE_DTYPES(FIAR_DETAIL_DEFINE_LAUNCHES_OF_DTYPE, , Op)
FIAR_INSTANTIATE_OPERATIONS(FIAR_DETAIL_DEFINE_LAUNCHES)
