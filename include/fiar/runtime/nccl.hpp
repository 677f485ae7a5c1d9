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

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

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

#endif  // FIAR_HAS_NCCL

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
FIAR_END_NAMESPACE
