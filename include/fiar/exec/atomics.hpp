// SPDX-License-Identifier: Apache-2.0
// fiar/exec/atomics.hpp — the cross-rank memory operations both execution contexts share.
// Contract: flag words use cuda::atomic_ref at system scope (the same atomics on host and device);
// every access to memory another rank writes or reads concurrently goes through these functions.
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// System-scope atomics on 32-bit words, identical for HostCtx and DeviceCtx.
struct SystemAtomics {
  using Ref = cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>;

  FIAR_HD static std::uint32_t load_relaxed(const std::uint32_t* p) {
    return Ref(*const_cast<std::uint32_t*>(p)).load(cuda::std::memory_order_relaxed);
  }
  FIAR_HD static std::uint32_t load_acquire(const std::uint32_t* p) {
    return Ref(*const_cast<std::uint32_t*>(p)).load(cuda::std::memory_order_acquire);
  }
  FIAR_HD static void store_relaxed(std::uint32_t* p, std::uint32_t v) {
    Ref(*p).store(v, cuda::std::memory_order_relaxed);
  }
  FIAR_HD static void store_release(std::uint32_t* p, std::uint32_t v) {
    Ref(*p).store(v, cuda::std::memory_order_release);
  }
  FIAR_HD static std::uint32_t fetch_add_acq_rel(std::uint32_t* p, std::uint32_t v) {
    return Ref(*p).fetch_add(v, cuda::std::memory_order_acq_rel);
  }
  FIAR_HD static std::uint32_t fetch_or_relaxed(std::uint32_t* p, std::uint32_t v) {
    return Ref(*p).fetch_or(v, cuda::std::memory_order_relaxed);
  }
  FIAR_HD static void fence_system() {
    cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
  }
};

}  // namespace exec
FIAR_END_NAMESPACE
