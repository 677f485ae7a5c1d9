// SPDX-License-Identifier: Apache-2.0
// fiar/exec/kernel.cuh — the one __global__ template: kernel<Op> runs any Operation on the GPU (defined in
// exec/device_kernel.cuh), and launch_on_stream<Op> launches it with programmatic dependent launch where the loaded
// image supports it.
// Contract: hidden visibility (shared objects never swap kernels); the kernel waits for the stream's previous work
// (griddepcontrol.wait) before it runs and releases its successor only at the very end; the kernel's name in
// profiles is its operation's type (e.g. fiar::...::TrtllmOneShot<...>); a failed launch throws fiar::cuda_error
// naming the operation and the shape.
#pragma once

#if !defined(__CUDACC__)
#error "fiar/exec/kernel.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../runtime/cuda.hpp"
#include "context.hpp"
#include "device_kernel.cuh"
#include "operation.hpp"

// Everything here is hidden: a shared object that includes fiar launches its own kernels through its own helpers,
// never another object's (and keeps its own cache of the loaded image's architecture).
#pragma GCC visibility push(hidden)
FIAR_BEGIN_NAMESPACE
namespace exec {

/// The architecture (x10) of the image the driver loaded for kernel<Op> on `device` (its binaryVersion; 0 when it
/// cannot be read). Cached per device.
template <Operation Op>
int image_arch(int device) {
  static std::atomic<int> cached[64] = {};
  if (device < 0 || device >= 64) return 0;
  int arch = cached[device].load(std::memory_order_relaxed);
  if (arch != 0) return arch;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel<Op>) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  arch = attributes.binaryVersion;
  cached[device].store(arch, std::memory_order_relaxed);
  return arch;
}

/// The largest cluster of kernel<Op> (8, 4, 2 or 1 blocks) of which the current device `device` can hold one resident
/// (cudaOccupancyMaxActiveClusters at Op's most threads per block): a MIG slice or a green context with few SMs per
/// GPC may not fit 8. Cached per device. Outputs never depend on the cluster size (the epilogue's sums are
/// canonical), so a smaller one only spreads a token over fewer blocks.
template <Operation Op>
int resident_cluster(int device) {
  static std::atomic<int> cached[64] = {};
  if (device < 0 || device >= 64) return kMaxCluster;
  int cluster = cached[device].load(std::memory_order_relaxed);
  if (cluster != 0) return cluster;
  for (cluster = kMaxCluster; cluster > 1; cluster /= 2) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster));
    config.blockDim = dim3(static_cast<unsigned>(Op::max_threads));
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int resident = 0;
    if (cudaOccupancyMaxActiveClusters(&resident, kernel<Op>, &config) == cudaSuccess && resident > 0) break;
    (void)cudaGetLastError();  // an unsupported size is not an error of the next launch
  }
  cached[device].store(cluster, std::memory_order_relaxed);
  return cluster;
}

/// Launches kernel<Op>(p) on `stream` with `shape` (device `device` current), with programmatic dependent launch
/// when `pdl` is asked for and the loaded image is sm_90 or newer.
/// A cluster the device cannot hold resident is halved (resident_cluster).
template <Operation Op>
void launch_on_stream(const typename Op::Params& p, const LaunchShape& shape, cudaStream_t stream, bool pdl,
                      int device) {
  detail::DeviceGuard guard(device);
  LaunchShape fitted = shape;  // blocks stay a multiple of a halved cluster
  if (fitted.cluster > 1) {
    const int most = resident_cluster<Op>(device);
    while (fitted.cluster > most) fitted.cluster /= 2;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(shape.blocks));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (pdl && image_arch<Op>(device) >= 90) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (fitted.cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(fitted.cluster);
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel<Op>, p);
  // The texts are written only when the launch failed: no string on the success path.
  detail::cuda_check(
      e,
      [&] {
        std::string what = Op::name;
        if constexpr (requires {
                        Op::pattern;
                        typename Op::value_type;
                      }) {
          what +=
              ", " + std::string(to_string(Op::pattern)) + ", " + std::string(dtype_name<typename Op::value_type>());
        }
        return "cudaLaunchKernelEx (" + what + ", " + std::to_string(shape.blocks) + " x " +
               std::to_string(shape.threads) + " threads) on device " + std::to_string(device);
      },
      [&] {
        return "the stream belongs to device " + std::to_string(device) +
               ", the binary was built for this GPU's architecture (gpu_archs), and no earlier kernel faulted";
      });
}

}  // namespace exec
FIAR_END_NAMESPACE
#pragma GCC visibility pop
