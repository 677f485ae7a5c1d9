// SPDX-License-Identifier: Apache-2.0
// The CUDA basics of the GPU tests, without Catch2 (gpu-ipc-rank, a plain program, uses them too): GPU_CHECK, device
// memory and streams that free themselves, copies between host vectors and device memory, and what the visible
// GPUs are (test code only). The Catch2 side (ranks as threads, shared checks) is gpu_support.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace fiar_test {

// "cudaErrorInvalidDevice (invalid device ordinal)": the error's name and the runtime's description of it.
inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// Throws std::runtime_error "<what>: <error>" unless `status` is cudaSuccess.
inline void gpu_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cuda_error_text(status));
}

}  // namespace fiar_test

// Throws std::runtime_error naming the failed CUDA call and its error.
#define GPU_CHECK(call) ::fiar_test::gpu_check((call), #call)

namespace fiar_test {

// A device buffer that frees itself.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(std::size_t count) {
    GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)cudaFree(p); }
};

// A non-blocking stream that destroys itself.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { (void)cudaStreamDestroy(s); }
};

// Host to device, ordered on `stream` (the host vector must stay alive until the stream is synchronized).
template <class T>
void upload(T* to, const std::vector<T>& from, cudaStream_t stream) {
  GPU_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}

// Device to host: `count` elements into `to` (resized), ordered on `stream`; complete once it is synchronized.
template <class T>
void download(std::vector<T>& to, const T* from, std::size_t count, cudaStream_t stream) {
  to.resize(count);
  GPU_CHECK(cudaMemcpyAsync(to.data(), from, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
}

// Device to host with cudaMemcpy: complete on return.
template <class T>
void download(std::vector<T>& to, const T* from, std::size_t count) {
  to.resize(count);
  GPU_CHECK(cudaMemcpy(to.data(), from, count * sizeof(T), cudaMemcpyDeviceToHost));
}

// What enqueue() puts on `stream`, captured into a CUDA graph and instantiated; destroyed with this object. Capture is
// thread-local: the other ranks (threads of this process) keep calling the runtime meanwhile.
class CapturedGraph {
 public:
  template <class Enqueue>
  CapturedGraph(cudaStream_t stream, Enqueue&& enqueue) {
    GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph_);  // leave the stream usable
      (void)cudaGetLastError();
      release();
      throw;
    }
    GPU_CHECK(cudaStreamEndCapture(stream, &graph_));
    try {
      GPU_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    } catch (...) {
      release();
      throw;
    }
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() { release(); }

  void launch(cudaStream_t stream) const { GPU_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  void release() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Visible CUDA devices; 0 when the runtime cannot count them.
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return n;
}

// sm_XY of `device`, as the CUDA runtime reports it.
inline int device_arch(int device) {
  int major = 0, minor = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// "" when each of devices 0 .. n-1 can access every other one, else which pair cannot (trtllm maps its peers'
// memory, so it cannot run across them).
inline std::string missing_peer_access(int n) {
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0)) {
        return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
               " (no peer-to-peer path): trtllm cannot run across them";
      }
    }
  }
  return "";
}

}  // namespace fiar_test
