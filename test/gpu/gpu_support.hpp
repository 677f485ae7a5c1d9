// Small RAII helpers shared by the GPU tests, and their ranks as threads on GPUs (test code only).
#pragma once

#include <cuda_runtime_api.h>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/host_harness.hpp"

// Throws std::runtime_error naming the failed CUDA call and its error.
#define GPU_CHECK(call)                                                                                    \
  do {                                                                                                     \
    const cudaError_t gpu_check_status = (call);                                                           \
    if (gpu_check_status != cudaSuccess) {                                                                 \
      throw std::runtime_error(std::string(#call) + ": " + fiar::detail::describe_cuda(gpu_check_status)); \
    }                                                                                                      \
  } while (0)

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

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { (void)cudaStreamDestroy(s); }
};

// fiar_test::run_ranks (common/host_harness.hpp) with devices[rank] current on each rank's thread. Named apart:
// run_ranks({0}, ...) would take {0} for a world size.
inline std::vector<std::string> run_ranks_on(const std::vector<int>& devices,
                                             const std::function<void(int, fiar::InProcessBootstrap&)>& body,
                                             std::chrono::milliseconds bootstrap_timeout = std::chrono::seconds(60)) {
  return run_ranks(
      static_cast<int>(devices.size()),
      [&](int rank, fiar::InProcessBootstrap& boot) {
        GPU_CHECK(cudaSetDevice(devices[static_cast<std::size_t>(rank)]));
        body(rank, boot);
      },
      bootstrap_timeout);
}

}  // namespace fiar_test
