// SPDX-License-Identifier: Apache-2.0
// fiar/platform/cuda_vmm.hpp — what a CudaPlatform owns of its multicast regions: references to cuMem allocations and
// multicast objects (shared by the ranks of one process), the registry where those ranks find each other's handles,
// and the mappings and bindings to undo.
// Contract: every reference releases its allocation when the last rank of the process lets go; MulticastResources is
// move-only and releases everything (on its device, failures ignored) when it goes; nothing here throws on release.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../core/prelude.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/driver.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// One reference to a cuMem allocation or multicast object (created or imported by this process); cuMemRelease
/// when the last rank of the process that uses it lets go.
class SharedAllocation {
 public:
  explicit SharedAllocation(CUmemGenericAllocationHandle h) : handle(h) {}
  SharedAllocation(const SharedAllocation&) = delete;
  SharedAllocation& operator=(const SharedAllocation&) = delete;
  ~SharedAllocation() {
    if (vmm_driver().mem_release != nullptr) (void)vmm_driver().mem_release(handle);
  }
  const CUmemGenericAllocationHandle handle;
};
using AllocationRef = std::shared_ptr<const SharedAllocation>;

/// Slot of the group's multicast object in the registry (rank r's memory is slot r).
inline constexpr int kMulticastSlot = -1;

/// Where the ranks of one process find the handles another rank of the process created or imported (a handle
/// is valid in the whole process, so each allocation is imported once per process). Keyed by (group id, slot);
/// holds weak references: the publisher keeps the allocation alive until every rank of the group has its own.
class AllocationRegistry {
 public:
  static void publish(std::uint64_t group, int slot, const AllocationRef& ref) {
    State& s = state();
    std::lock_guard lock(s.mutex);
    for (auto it = s.entries.begin(); it != s.entries.end();) it = it->second.expired() ? s.entries.erase(it) : ++it;
    s.entries[{group, slot}] = ref;
  }
  static AllocationRef find(std::uint64_t group, int slot) {
    State& s = state();
    std::lock_guard lock(s.mutex);
    const auto it = s.entries.find({group, slot});
    return it == s.entries.end() ? nullptr : it->second.lock();
  }
  static void erase(std::uint64_t group, int slot) noexcept {
    State& s = state();
    std::lock_guard lock(s.mutex);
    s.entries.erase({group, slot});
  }

 private:
  struct State {
    std::mutex mutex;
    std::map<std::pair<std::uint64_t, int>, std::weak_ptr<const SharedAllocation>> entries;
  };
  static State& state() {
    static State s;
    return s;
  }
};

/// Everything a CudaPlatform holds for its multicast regions: virtual ranges (mapped or only reserved), bindings of
/// its memory to multicast objects, and references to allocations. Move-only; released (on `device`, failures
/// ignored) when it goes.
class MulticastResources {
 public:
  MulticastResources() = default;
  MulticastResources(MulticastResources&& other) noexcept { swap(other); }
  MulticastResources& operator=(MulticastResources other) noexcept {
    swap(other);
    return *this;
  }
  ~MulticastResources() { release(); }

  void swap(MulticastResources& other) noexcept {
    std::swap(device_, other.device_);
    held_.swap(other.held_);
    ranges_.swap(other.ranges_);
    bindings_.swap(other.bindings_);
  }
  /// The CUDA device whose context the mappings belong to (current while they are released).
  void set_device(int device) noexcept { device_ = device; }

  [[nodiscard]] bool empty() const noexcept { return held_.empty() && ranges_.empty() && bindings_.empty(); }

  void hold(const AllocationRef& ref) { held_.push_back(ref); }
  /// Records a reserved range; returns its index for mark_mapped.
  std::size_t add_range(CUdeviceptr va, std::size_t size) {
    ranges_.push_back({va, size, false});
    return ranges_.size() - 1;
  }
  void mark_mapped(std::size_t index) { ranges_[index].mapped = true; }
  void add_binding(const AllocationRef& multicast, CUdevice device, std::size_t size) {
    bindings_.push_back({multicast, device, size});
  }

  /// Unmaps and frees every range, unbinds this rank's memory, drops the references (the last one releases the
  /// allocation); failures are ignored.
  void release() noexcept {
    if (empty()) return;
    DeviceGuard guard(device_, DeviceGuard::NoThrow{});
    const VmmDriver& cu = vmm_driver();
    for (auto it = ranges_.rbegin(); it != ranges_.rend(); ++it) {
      if (it->mapped && cu.mem_unmap != nullptr) (void)cu.mem_unmap(it->va, it->size);
      if (cu.mem_address_free != nullptr) (void)cu.mem_address_free(it->va, it->size);
    }
    for (const Binding& b : bindings_) {
      if (cu.multicast_unbind != nullptr) (void)cu.multicast_unbind(b.multicast->handle, b.device, 0, b.size);
    }
    ranges_.clear();
    bindings_.clear();
    held_.clear();
    (void)cudaGetLastError();
  }

 private:
  struct Range {
    CUdeviceptr va;
    std::size_t size;
    bool mapped;
  };
  struct Binding {
    AllocationRef multicast;
    CUdevice device;
    std::size_t size;
  };
  int device_ = -1;
  std::vector<AllocationRef> held_;
  std::vector<Range> ranges_;
  std::vector<Binding> bindings_;
};

}  // namespace detail
FIAR_END_NAMESPACE
