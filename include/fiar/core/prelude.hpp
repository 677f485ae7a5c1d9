// SPDX-License-Identifier: Apache-2.0
// fiar/core/prelude.hpp — what every fiar header starts from: the namespace macros, the ABI namespace and the
// host/device markers.
// Contract: every fiar symbol is declared between FIAR_BEGIN_NAMESPACE and FIAR_END_NAMESPACE, that is in the
// versioned inline namespace fiar::v0_1 and, inside it, an inline namespace naming the build's ABI choice
// (FIAR_HAS_NCCL), so translation units built with different choices fail to link instead of mixing bodies.
#pragma once

// fiar is C++20 (concepts, constexpr std::string): say so before any of it fails to parse.
#if __cplusplus < 202002L
#error \
    "fiar needs C++20: compile with -std=c++20 (nvcc too). Meson: default_options ['cpp_std=c++20', 'cuda_std=c++20']; CMake: link fiar::fiar (it sets C++20) or target_compile_features(<target> PUBLIC cxx_std_20)."
#endif

// NCCL is optional (the nccl backend on GPUs, NcclBootstrap): 1 needs <nccl.h> and -lnccl.
#if !defined(FIAR_HAS_NCCL)
#define FIAR_HAS_NCCL 0
#endif

#if FIAR_HAS_NCCL
#define FIAR_ABI_NAMESPACE with_nccl
#else
#define FIAR_ABI_NAMESPACE without_nccl
#endif

// Spelled as macros so that every header opens and closes the same namespaces (ctags/cscope: -I FIAR_BEGIN_NAMESPACE).
#define FIAR_BEGIN_NAMESPACE \
  namespace fiar {           \
  inline namespace v0_1 {    \
  inline namespace FIAR_ABI_NAMESPACE {
#define FIAR_END_NAMESPACE \
  }                        \
  }                        \
  }

// X(args...): applies a one-argument list macro's X where a list passes X(args..., item).
#define FIAR_DETAIL_APPLY(X, ...) X(__VA_ARGS__)

#if defined(__CUDA_ARCH__)
#define FIAR_UNROLL _Pragma("unroll")
#define FIAR_NO_UNROLL _Pragma("unroll 1")
#else
#define FIAR_UNROLL
#define FIAR_NO_UNROLL
#endif

#if defined(__CUDACC__)
/// A function that runs on the host and on the device (algo/ code, the execution contexts' shared parts).
#define FIAR_HD __host__ __device__
// Before a host-device template that is also instantiated with host-only types (HostCtx): nvcc then checks the
// execution space of each instantiation only where it is used.
#define FIAR_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
/// A cold path (error records) kept out of a kernel's hot loop.
#define FIAR_NOINLINE __noinline__
#else
#define FIAR_HD
#define FIAR_EXEC_CHECK_DISABLE
#define FIAR_NOINLINE __attribute__((noinline))
#endif
