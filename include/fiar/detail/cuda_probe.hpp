// fiar/detail/cuda_probe.hpp — host-side queries of the calling thread's CUDA device, without -lcuda.
// Contract: never throws and never crashes without a GPU or driver; every failure comes back as text,
// and the CUDA runtime's sticky error is cleared. Driver entry points are fetched through cudart.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "../version.hpp"

namespace fiar::inline v0_1::detail {

/// "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version".
inline std::string describe_cuda(cudaError_t e) {
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

}  // namespace fiar::inline v0_1::detail
