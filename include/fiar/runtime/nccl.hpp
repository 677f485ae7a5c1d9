// SPDX-License-Identifier: Apache-2.0
// fiar/runtime/nccl.hpp — thin wrappers over NCCL: whether fiar was built with it, failed calls as fiar::cuda_error,
// bounded waits on a communicator, and the owning communicator handle. Without FIAR_HAS_NCCL nothing here needs
// <nccl.h> or libnccl.
// Contract: FIAR_HAS_NCCL is 0 or 1 (core/prelude.hpp); with 1, <nccl.h> must be on the include path (else a clear
// #error); every failure text names the call, the ncclResult_t, NCCL's text and what to check; teardown never throws.
#pragma once

#include "../core/prelude.hpp"

#if FIAR_HAS_NCCL
#if !__has_include(<nccl.h>)
#error \
    "fiar: FIAR_HAS_NCCL=1 but <nccl.h> is not on the include path. Fix: add <nccl>/include (or <cuda>/include when NCCL sits there), or build without -DFIAR_HAS_NCCL."
#endif
#include <nccl.h>
#endif

// 1 when <nccl.h> has symmetric windows (ncclMemAlloc, ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC: NCCL 2.27+).
#if FIAR_HAS_NCCL && defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 22700
#define FIAR_NCCL_HAS_WINDOWS 1
#else
#define FIAR_NCCL_HAS_WINDOWS 0
#endif

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "../core/dtype.hpp"
#include "../core/errors.hpp"

// NCCL's communicator type, named without <nccl.h>: ncclComm_t is `struct ncclComm*` (nccl.h), so a workspace
// can hold and accept one in builds without NCCL too.
struct ncclComm;

FIAR_BEGIN_NAMESPACE

/// True when this build of fiar can use NCCL (FIAR_HAS_NCCL=1: <nccl.h> found and libnccl linked).
inline constexpr bool built_with_nccl = FIAR_HAS_NCCL != 0;

/// An NCCL communicator (ncclComm_t), spelled so that it exists without <nccl.h>.
using NcclComm = ::ncclComm*;

namespace detail {

/// The message for a workspace or bootstrap that needs NCCL in a build without it.
inline std::string built_without_nccl_text(const std::string& what) {
  return "fiar: " + what +
         " needs NCCL, but fiar was built without NCCL (FIAR_HAS_NCCL is not set). Fix: install NCCL "
         "(libnccl-dev, or the nvidia-nccl wheel into <cuda>) and build with -Dnccl=enabled (meson) or "
         "-DFIAR_HAS_NCCL=1 -lnccl; or use the trtllm / mnnvl backend, or HostPlatform, which need no NCCL.";
}

#if FIAR_HAS_NCCL

/// The NCCL element type of T.
template <ReduceType T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) {
    return ncclFloat32;
  } else if constexpr (std::is_same_v<T, __half>) {
    return ncclFloat16;
  } else {
    return ncclBfloat16;
  }
}

/// "fiar: ncclAllReduce(...) failed: ncclResult_t 2 (unhandled system error): <NCCL's last error>. Check: ...".
inline std::string nccl_failure_text(const std::string& call, ncclResult_t r, const std::string& check,
                                     NcclComm comm = nullptr) {
  const char* text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  std::string s = "fiar: " + call + " failed: ncclResult_t " + std::to_string(static_cast<int>(r)) + " (" +
                  (text != nullptr ? text : "no description") + ")";
  if (last != nullptr && last[0] != '\0') s += ": " + std::string(last);
  if (!check.empty()) s += ". Check: " + check;
  return s;
}

/// Throws fiar::cuda_error (status = the ncclResult_t) unless r is ncclSuccess or ncclInProgress.
inline void nccl_check(ncclResult_t r, const std::string& call, const std::string& check, NcclComm comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw cuda_error(nccl_failure_text(call, r, check, comm), static_cast<int>(r));
}

/// Polls a communicator until its pending host-side operation (non-blocking initialization, finalization, or
/// the enqueueing of a collective) has completed, or `deadline` passes. Returns ncclSuccess, the error, or
/// ncclInProgress when the deadline passed.
inline ncclResult_t nccl_wait(NcclComm comm, std::chrono::steady_clock::time_point deadline) {
  for (int spin = 0;; ++spin) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() > deadline) return ncclInProgress;
    if (spin < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

/// NCCL's version at run time (ncclGetVersion: 22809 for 2.28.9), 0 when it cannot tell.
inline int nccl_runtime_version() noexcept {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
}

#endif  // FIAR_HAS_NCCL

/// The first NCCL with symmetric windows (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC): 2.27.0.
inline constexpr int kNcclSymmetricVersion = 22700;

/// Whether this build's <nccl.h> declares symmetric windows (NCCL 2.27 or newer at compile time).
inline constexpr bool built_with_nccl_symmetric = FIAR_NCCL_HAS_WINDOWS != 0;

/// Device memory from ncclMemAlloc (what symmetric windows need), released with ncclMemFree. Never throws on release.
class NcclMemory {
 public:
  NcclMemory() = default;
  NcclMemory(void* p, std::size_t bytes) noexcept : p_(p), bytes_(bytes) {}
  NcclMemory(NcclMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  NcclMemory& operator=(NcclMemory o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~NcclMemory() {
#if FIAR_HAS_NCCL
    if (p_ != nullptr) (void)ncclMemFree(p_);
#endif
  }
  [[nodiscard]] void* get() const noexcept { return p_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Destroys an owned communicator: finalize (waiting at most `timeout` for its operations), then destroy; abort
/// instead when finalizing fails or does not finish in time. Leaves an adopted one alone. Never throws.
struct NcclCommRelease {
  bool owned = false;
  std::chrono::milliseconds timeout{0};
  void operator()(NcclComm comm) const noexcept {
#if FIAR_HAS_NCCL
    if (!owned) return;
    const ncclResult_t r = ncclCommFinalize(comm);
    const bool finalized = (r == ncclSuccess || r == ncclInProgress) &&
                           nccl_wait(comm, std::chrono::steady_clock::now() + timeout) == ncclSuccess;
    (void)(finalized ? ncclCommDestroy(comm) : ncclCommAbort(comm));
#else
    (void)comm;
#endif
  }
};

/// An NCCL communicator, owned (destroyed or aborted here) or adopted (left alone).
class NcclCommHandle {
 public:
  NcclCommHandle() = default;
  NcclCommHandle(NcclComm comm, bool owned, std::chrono::milliseconds timeout) noexcept
      : comm_(comm, NcclCommRelease{owned, timeout}) {}

  [[nodiscard]] NcclComm get() const noexcept { return comm_.get(); }
  [[nodiscard]] bool owned() const noexcept { return comm_.get_deleter().owned; }

  /// Aborts an owned communicator now (NCCL's kernels waiting for a peer return); forgets an adopted one.
  void abort() noexcept {
    NcclComm comm = comm_.release();
#if FIAR_HAS_NCCL
    if (comm != nullptr && owned()) (void)ncclCommAbort(comm);
#else
    (void)comm;
#endif
  }

 private:
  std::unique_ptr<ncclComm, NcclCommRelease> comm_;
};

}  // namespace detail

/// The NCCL fiar runs with: ncclGetVersion's code (22809 for 2.28.9), 0 in a build without NCCL.
inline int nccl_version() noexcept {
#if FIAR_HAS_NCCL
  return detail::nccl_runtime_version();
#else
  return 0;
#endif
}

/// Whether a nccl workspace on GPUs can register a symmetric window (this build's nccl.h and the loaded NCCL are 2.27
/// or newer); the workspace then runs NCCL's symmetric kernels unless FIAR_NCCL_SYMMETRIC=0 or it adopts a
/// communicator.
inline bool nccl_symmetric_available() noexcept {
  return detail::built_with_nccl_symmetric && nccl_version() >= detail::kNcclSymmetricVersion;
}
FIAR_END_NAMESPACE
