// SPDX-License-Identifier: Apache-2.0
// fiar/runtime/nvml.hpp — private: whether two GPUs reach each other over NVLink, asked of NVML at run time.
// Contract: NVML (libnvidia-ml.so.1, installed with the driver) is opened with dlopen on first use and never linked;
// without it, or when it cannot answer, the answer is "unknown" (std::nullopt), never an error. Thread-safe.
#pragma once

#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

// The few NVML declarations fiar uses (values from NVML's public header: NVML_SUCCESS 0, NVML_P2P_STATUS_OK 0,
// NVML_P2P_CAPS_INDEX_NVLINK 2); the toolkit does not ship nvml.h.
struct NvmlApi {
  using Device = struct NvmlDeviceOpaque*;
  int (*init)() = nullptr;
  int (*device_by_bus_id)(const char*, Device*) = nullptr;
  int (*p2p_status)(Device, Device, int, int*) = nullptr;
  bool ready = false;
};
inline constexpr int kNvmlSuccess = 0;
inline constexpr int kNvmlP2pStatusOk = 0;
inline constexpr int kNvmlP2pCapsNvlink = 2;

inline const NvmlApi& nvml() {
  static NvmlApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    api.init = reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"));
    api.device_by_bus_id =
        reinterpret_cast<int (*)(const char*, NvmlApi::Device*)>(::dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    api.p2p_status =
        reinterpret_cast<int (*)(NvmlApi::Device, NvmlApi::Device, int, int*)>(::dlsym(lib, "nvmlDeviceGetP2PStatus"));
    api.ready = api.init != nullptr && api.device_by_bus_id != nullptr && api.p2p_status != nullptr &&
                api.init() == kNvmlSuccess;
    // The library stays loaded for the process (NVML keeps state; shutting it down here could pull it from under
    // another user of NVML in the same process).
  });
  return api;
}

/// true: the GPUs at these PCI bus ids have an NVLink path (direct or through NVSwitch); false: they do not (PCIe);
/// nullopt: NVML is not there or cannot tell.
inline std::optional<bool> nvlink_between(const std::string& bus_a, const std::string& bus_b) {
  const NvmlApi& api = nvml();
  if (!api.ready) return std::nullopt;
  NvmlApi::Device a = nullptr, b = nullptr;
  if (api.device_by_bus_id(bus_a.c_str(), &a) != kNvmlSuccess ||
      api.device_by_bus_id(bus_b.c_str(), &b) != kNvmlSuccess)
    return std::nullopt;
  int status = -1;
  if (api.p2p_status(a, b, kNvmlP2pCapsNvlink, &status) != kNvmlSuccess) return std::nullopt;
  return status == kNvmlP2pStatusOk;
}

}  // namespace detail
FIAR_END_NAMESPACE
