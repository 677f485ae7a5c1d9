// SPDX-License-Identifier: Apache-2.0
// fiar/instantiate.cuh — defines CudaPlatform::launch for every fiar operation, pattern and element type: include it
// in exactly one nvcc translation unit of each linked module (executable or shared library) that runs on CudaPlatform.
// Contract: standard-conforming explicit instantiation definitions of what <fiar/fiar.hpp> declares `extern template`
// (backend/registry.hpp). Before including it, a translation unit may select a subset (to split the kernels over
// several translation units of one module, or to build fewer): define FIAR_INSTANTIATE_DTYPES(X, ...) as a sublist of
// FIAR_FOR_EACH_DTYPE, FIAR_INSTANTIATE_PATTERNS(X, ...) as a sublist of FIAR_FOR_EACH_PATTERN, and/or
// FIAR_INSTANTIATE_OPERATIONS(X) as a sublist of FIAR_ALL_OPERATIONS. Calling a launch no translation unit defines is
// a link error naming CudaPlatform::launch. FIAR_INSTANTIATE_EPILOGUE(E, T), after the include, defines the launches of
// the user epilogue E (algo/user_epilogue.hpp) for element type T, every operation: once per module, like these.
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

/// The launches of user epilogue E on element type T, for every operation of every backend (one kernel each): write it
/// once per (E, T) that Workspace::run<E> uses on CudaPlatform, at namespace scope after this header, in one nvcc
/// translation unit of the module (the header that defines E included there too).
#define FIAR_INSTANTIATE_EPILOGUE(E, T) FIAR_DETAIL_ALL_OPERATIONS_WITH(FIAR_DETAIL_EPILOGUE_LAUNCH, E, T)
#define FIAR_DETAIL_EPILOGUE_LAUNCH(E, T, Op)                                          \
  template void ::fiar::CudaPlatform::launch<::fiar::Op<::fiar::user_epilogue<E>, T>>( \
      const ::fiar::Op<::fiar::user_epilogue<E>, T>::Params&, cudaStream_t);
