// Small RAII helpers shared by the GPU tests (test code only).
#pragma once

#include <cuda_runtime_api.h>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

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

}  // namespace fiar_test
