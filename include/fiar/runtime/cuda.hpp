// SPDX-License-Identifier: Apache-2.0
// fiar/runtime/cuda.hpp — thin wrappers over the CUDA runtime: error translation, driver entry points fetched
// through cudart (never -lcuda), the current-device guard, and RAII handles for what fiar allocates.
// Contract: a failed call becomes fiar::cuda_error naming the call, the CUDA error and what to check, after the
// sticky error is cleared; queries that may run without a GPU never throw; handles free in their destructor
// (on their own device, failures ignored) and are move-only. Knows nothing of fiar's protocols.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "../core/errors.hpp"
#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version".
inline std::string describe_cuda(cudaError_t e) {
  if (e == cudaErrorInsufficientDriver) {
    // CUDA's own words ("driver version is insufficient") also cover a machine with no driver at all.
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
      return "cudaErrorInsufficientDriver: no CUDA driver found (libcuda is not installed, or not visible here)";
    }
    (void)cudaRuntimeGetVersion(&runtime);
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    return "cudaErrorInsufficientDriver: the CUDA driver supports CUDA " + version(driver) +
           ", older than the runtime fiar was built with (" + version(runtime) + "); update the driver";
  }
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

/// A driver API function fetched through cudart (nullptr when the driver lacks it or is absent).
template <class Fn>
Fn driver_entry_point(const char* symbol, unsigned int cuda_version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, cuda_version, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

/// Reads a CUdevice_attribute of CUDA ordinal `device` through the driver; false when it cannot be read.
inline bool driver_attribute(int device, CUdevice_attribute attribute, int& value) {
  using GetFn = CUresult (*)(CUdevice*, int);
  using AttrFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  static const auto get = driver_entry_point<GetFn>("cuDeviceGet", 12000);
  static const auto attr = driver_entry_point<AttrFn>("cuDeviceGetAttribute", 12000);
  CUdevice dev{};
  return get != nullptr && attr != nullptr && get(&dev, device) == CUDA_SUCCESS &&
         attr(&value, attribute, dev) == CUDA_SUCCESS;
}

/// The text of a failed call: "fiar: cudaMalloc(1048576 bytes) on device 0 failed: cudaErrorMemoryAllocation: out
/// of memory. Check: ...".
inline std::string cuda_failure_text(const std::string& call, cudaError_t e, const std::string& check) {
  return "fiar: " + call + " failed: " + describe_cuda(e) + (check.empty() ? "" : ". Check: " + check);
}

/// A message part: text, or a callable that writes it (so a call's success path builds no string).
template <class Text>
std::string text_of(Text&& text) {
  if constexpr (std::is_invocable_v<Text&>) {
    return std::string(text());
  } else {
    return std::string(std::forward<Text>(text));
  }
}

/// Throws fiar::cuda_error when `e` is not cudaSuccess (after clearing the runtime's sticky error). `call` and
/// `check` are text (a literal costs nothing) or callables returning it, evaluated only on failure: per-call paths
/// (launches, copies) pass lambdas for anything they would have to build.
template <class Call, class Check>
void cuda_check(cudaError_t e, Call&& call, Check&& check) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw cuda_error(cuda_failure_text(text_of(call), e, text_of(check)), static_cast<int>(e));
}

/// Makes `device` the calling thread's current device for a scope and restores the previous one. The throwing
/// constructor is for calls; NoThrow (destructors) switches when it can and ignores failures.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int current = -1;
    cuda_check(cudaGetDevice(&current), "cudaGetDevice", "that a CUDA driver and device are present");
    if (current != device) {
      cuda_check(
          cudaSetDevice(device), [&] { return "cudaSetDevice(" + std::to_string(device) + ")"; },
          [&] { return "that device " + std::to_string(device) + " is visible (CUDA_VISIBLE_DEVICES)"; });
      previous_ = current;
    }
  }
  struct NoThrow {};
  DeviceGuard(int device, NoThrow) noexcept {
    int current = -1;
    if (device >= 0 && cudaGetDevice(&current) == cudaSuccess && current != device &&
        cudaSetDevice(device) == cudaSuccess) {
      previous_ = current;
    }
    (void)cudaGetLastError();
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

/// Releases a CUDA resource on the device it belongs to, ignoring failures (the runtime may be shutting down).
template <auto Free>
struct OnDevice {
  int device = -1;
  template <class P>
  void operator()(P* p) const noexcept {
    DeviceGuard guard(device, DeviceGuard::NoThrow{});
    (void)Free(p);
    (void)cudaGetLastError();
  }
};

inline cudaError_t free_device(void* p) { return cudaFree(p); }
inline cudaError_t free_host(void* p) { return cudaFreeHost(p); }
inline cudaError_t close_ipc(void* p) { return cudaIpcCloseMemHandle(p); }
// Work still queued on the stream finishes on its own (cudaStreamDestroy does not wait); cudaFree waits for the
// device, but unmapping VMM memory (platform/cuda_vmm.hpp) does not: fiar's teardown contract (destroy a workspace
// only after its last call finished on every rank) is what keeps memory alive while kernels use it.
inline cudaError_t destroy_stream(CUstream_st* s) { return cudaStreamDestroy(s); }
inline cudaError_t destroy_event(CUevent_st* e) { return cudaEventDestroy(e); }

/// Device memory (cudaMalloc), pinned host memory (cudaHostAlloc), a peer's memory opened over CUDA IPC, a stream
/// and an event, each released on its device when the handle goes.
using DeviceMemory = std::unique_ptr<void, OnDevice<free_device>>;
using PinnedHostMemory = std::unique_ptr<void, OnDevice<free_host>>;
using IpcMapping = std::unique_ptr<void, OnDevice<close_ipc>>;
using StreamHandle = std::unique_ptr<CUstream_st, OnDevice<destroy_stream>>;
using EventHandle = std::unique_ptr<CUevent_st, OnDevice<destroy_event>>;

/// cudaMalloc of `bytes` on `device` (current), owned; `what` names the memory in the message, `check` the advice.
inline DeviceMemory device_malloc(int device, std::size_t bytes, const std::string& what, const std::string& check) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes),
             "cudaMalloc(" + std::to_string(bytes) + " bytes, " + what + ") on device " + std::to_string(device),
             check);
  return DeviceMemory(p, {device});
}

/// A non-blocking stream on `device` (current).
inline StreamHandle make_stream(int device, const std::string& what) {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags (" + what + ") on device " + std::to_string(device),
             "the device is healthy and not out of resources");
  return StreamHandle(s, {device});
}

/// An event without timing on `device` (current).
inline EventHandle make_event(int device, const std::string& what) {
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
             "cudaEventCreateWithFlags (" + what + ") on device " + std::to_string(device),
             "the device is healthy and not out of resources");
  return EventHandle(e, {device});
}

}  // namespace detail
FIAR_END_NAMESPACE
