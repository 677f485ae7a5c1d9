// SPDX-License-Identifier: Apache-2.0
// fiar/exec/atomics.hpp — the cross-rank memory operations both execution contexts share.
// Contract: flag words use system-scope atomics of the stated order: std::atomic_ref on the host (ThreadSanitizer sees
// them), one PTX .sys instruction each on the device; every access to memory another rank writes or reads
// concurrently goes through these functions.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <atomic>  // std::atomic_ref: the host side only (nvcc's device pass never parses it)
#endif

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// System-scope atomics on 32-bit words, identical for HostCtx and DeviceCtx. On the device each is one PTX
/// instruction on a generic address (what cuda::atomic_ref<uint32_t, thread_scope_system> emits: the same PTX),
/// written here because including <cuda/atomic> costs about 5 s of CPU per nvcc translation unit (2-core machine,
/// sm_90a; a TU of cuda_runtime.h and the 16-bit types costs 3 s) for these eight instructions; on the host they are
/// std::atomic_ref operations of the same memory order.
struct SystemAtomics {
  FIAR_HD static std::uint32_t load_relaxed(const std::uint32_t* p) {
#if defined(__CUDA_ARCH__)
    std::uint32_t v;  // ld.relaxed.sys: <cuda/atomic>'s load(relaxed), without its 5 s parse
    asm volatile("ld.relaxed.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(p)).load(std::memory_order_relaxed);
#endif
  }
  FIAR_HD static std::uint32_t load_acquire(const std::uint32_t* p) {
#if defined(__CUDA_ARCH__)
    std::uint32_t v;  // ld.acquire.sys: <cuda/atomic>'s load(acquire), without its 5 s parse
    asm volatile("ld.acquire.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(p)).load(std::memory_order_acquire);
#endif
  }
  FIAR_HD static void store_relaxed(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
    // st.relaxed.sys: <cuda/atomic>'s store(relaxed), without its 5 s parse
    asm volatile("st.relaxed.sys.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
#else
    std::atomic_ref<std::uint32_t>(*p).store(v, std::memory_order_relaxed);
#endif
  }
  FIAR_HD static void store_release(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
    // st.release.sys: <cuda/atomic>'s store(release), without its 5 s parse
    asm volatile("st.release.sys.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
#else
    std::atomic_ref<std::uint32_t>(*p).store(v, std::memory_order_release);
#endif
  }
  FIAR_HD static std::uint32_t fetch_add_acq_rel(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
    std::uint32_t old;  // atom.add.acq_rel.sys: <cuda/atomic>'s fetch_add(acq_rel), without its 5 s parse
    asm volatile("atom.add.acq_rel.sys.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#else
    return std::atomic_ref<std::uint32_t>(*p).fetch_add(v, std::memory_order_acq_rel);
#endif
  }
  FIAR_HD static std::uint32_t fetch_add_relaxed(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
    std::uint32_t old;  // atom.add.relaxed.sys: <cuda/atomic>'s fetch_add(relaxed), without its 5 s parse
    asm volatile("atom.add.relaxed.sys.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#else
    return std::atomic_ref<std::uint32_t>(*p).fetch_add(v, std::memory_order_relaxed);
#endif
  }
  FIAR_HD static std::uint32_t fetch_or_relaxed(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
    std::uint32_t old;  // atom.or.relaxed.sys: <cuda/atomic>'s fetch_or(relaxed), without its 5 s parse
    asm volatile("atom.or.relaxed.sys.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#else
    return std::atomic_ref<std::uint32_t>(*p).fetch_or(v, std::memory_order_relaxed);
#endif
  }
  FIAR_HD static void fence_system() {
#if defined(__CUDA_ARCH__)
    // fence.sc.sys: cuda::atomic_thread_fence(seq_cst, thread_scope_system), without <cuda/atomic>'s 5 s parse
    asm volatile("fence.sc.sys;" : : : "memory");
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }
};

}  // namespace exec
FIAR_END_NAMESPACE
