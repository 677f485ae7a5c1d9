// fiar/detail/cuda_check.hpp — turning a failed CUDA runtime call into fiar::cuda_error.
// Contract: the sticky error is cleared before anything is thrown; the message names the call, the
// CUDA error name and text, and what to check; never used in destructors (see DeviceGuard::restore).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "../errors.hpp"
#include "cuda_probe.hpp"

namespace fiar::inline v0_1::detail {

/// The text of a failed call: "fiar: cudaMalloc(1048576 bytes) on device 0 failed: cudaErrorMemoryAllocation:
/// out of memory. Check: ...".
inline std::string cuda_failure_text(const std::string& call, cudaError_t e, const std::string& check) {
  return "fiar: " + call + " failed: " + describe_cuda(e) + (check.empty() ? "" : ". Check: " + check);
}

/// Throws fiar::cuda_error when `e` is not cudaSuccess (after clearing the runtime's sticky error).
inline void cuda_check(cudaError_t e, const std::string& call, const std::string& check) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw cuda_error(cuda_failure_text(call, e, check), static_cast<int>(e));
}

/// Makes `device` the calling thread's current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int current = -1;
    cuda_check(cudaGetDevice(&current), "cudaGetDevice", "that a CUDA driver and device are present");
    if (current != device) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")",
                 "that device " + std::to_string(device) + " is visible (CUDA_VISIBLE_DEVICES)");
      previous_ = current;
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() { restore(); }

  /// Switches back now (idempotent, never throws).
  void restore() noexcept {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
    previous_ = -1;
  }

 private:
  int previous_ = -1;
};

}  // namespace fiar::inline v0_1::detail
