// SPDX-License-Identifier: Apache-2.0
// fiar/runtime/driver.hpp — the CUDA driver's virtual-memory and multicast entry points, fetched once per process
// through cudart (cudaGetDriverEntryPointByVersion), so nothing links -lcuda.
// Contract: vmm_driver() never throws; a missing entry point is a null pointer and is named in `missing`;
// cu_result_text names a CUresult even when the driver cannot describe it. Knows nothing of fiar's protocols.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "../core/prelude.hpp"
#include "cuda.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// The driver functions of VMM and multicast, fetched once per process through cudart.
struct VmmDriver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle*, std::size_t, const CUmemAllocationProp*,
                         unsigned long long) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*mem_get_allocation_granularity)(std::size_t*, const CUmemAllocationProp*,
                                             CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*mem_export)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*mem_import)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) = nullptr;
  CUresult (*multicast_create)(CUmemGenericAllocationHandle*, const CUmulticastObjectProp*) = nullptr;
  CUresult (*multicast_add_device)(CUmemGenericAllocationHandle, CUdevice) = nullptr;
  CUresult (*multicast_bind_mem)(CUmemGenericAllocationHandle, std::size_t, CUmemGenericAllocationHandle, std::size_t,
                                 std::size_t, unsigned long long) = nullptr;
  CUresult (*multicast_unbind)(CUmemGenericAllocationHandle, CUdevice, std::size_t, std::size_t) = nullptr;
  CUresult (*multicast_get_granularity)(std::size_t*, const CUmulticastObjectProp*,
                                        CUmulticastGranularity_flags) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;    // optional
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;  // optional
  const char* missing = nullptr;                                   ///< the first required entry point the driver lacks
  unsigned int missing_version = 0;
};

inline const VmmDriver& vmm_driver() {
  static const VmmDriver driver = [] {
    VmmDriver d;
    auto load = [&d](auto& fn, const char* symbol, unsigned int version, bool required = true) {
      fn = driver_entry_point<std::remove_reference_t<decltype(fn)>>(symbol, version);
      if (fn == nullptr && required && d.missing == nullptr) {
        d.missing = symbol;
        d.missing_version = version;
      }
    };
    // The multicast API arrived with CUDA 12.1; the rest of VMM is older, requested at its CUDA 12.0 version.
    load(d.multicast_create, "cuMulticastCreate", 12010);
    load(d.multicast_add_device, "cuMulticastAddDevice", 12010);
    load(d.multicast_bind_mem, "cuMulticastBindMem", 12010);
    load(d.multicast_unbind, "cuMulticastUnbind", 12010);
    load(d.multicast_get_granularity, "cuMulticastGetGranularity", 12010);
    load(d.device_get, "cuDeviceGet", 12000);
    load(d.device_get_attribute, "cuDeviceGetAttribute", 12000);
    load(d.mem_create, "cuMemCreate", 12000);
    load(d.mem_release, "cuMemRelease", 12000);
    load(d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity", 12000);
    load(d.mem_export, "cuMemExportToShareableHandle", 12000);
    load(d.mem_import, "cuMemImportFromShareableHandle", 12000);
    load(d.mem_address_reserve, "cuMemAddressReserve", 12000);
    load(d.mem_address_free, "cuMemAddressFree", 12000);
    load(d.mem_map, "cuMemMap", 12000);
    load(d.mem_unmap, "cuMemUnmap", 12000);
    load(d.mem_set_access, "cuMemSetAccess", 12000);
    load(d.get_error_name, "cuGetErrorName", 12000, false);
    load(d.get_error_string, "cuGetErrorString", 12000, false);
    return d;
  }();
  return driver;
}

/// "CUDA_ERROR_NOT_SUPPORTED (801): operation not supported".
inline std::string cu_result_text(CUresult r) {
  const VmmDriver& cu = vmm_driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cu.get_error_name == nullptr || cu.get_error_name(r, &name) != CUDA_SUCCESS || name == nullptr) name = "CUresult";
  if (cu.get_error_string == nullptr || cu.get_error_string(r, &text) != CUDA_SUCCESS) text = nullptr;
  return std::string(name) + " (" + std::to_string(static_cast<int>(r)) + ")" +
         (text != nullptr ? ": " + std::string(text) : "");
}

}  // namespace detail
FIAR_END_NAMESPACE
