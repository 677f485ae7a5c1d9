// SPDX-License-Identifier: Apache-2.0
// fiar/platform/cuda_multicast.hpp — CudaPlatform::allocate_multicast's setup, phase by phase (what a rank owns of the
// result is platform/cuda_vmm.hpp's).
// Contract: every failure is a fiar::multicast_error naming the call, the CUresult or errno, the device and what to
// check (std::invalid_argument for a bad argument); every socket wait ends at a deadline; the phases run between the
// platform's agree() steps, so every rank throws alike; releasing never throws.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/driver.hpp"
#include "../runtime/posix.hpp"
#include "cuda_vmm.hpp"
#include "region.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

// ---- messages -------------------------------------------------------------------------------------------------

/// What ends every multicast error: where to go when the machine cannot do it.
inline constexpr const char* kMulticastFallback =
    "Fallback: the trtllm backend on one node, nccl across nodes (FIAR_ALLREDUCE_BACKEND=trtllm or nccl); on one "
    "node, Backend::Auto falls back to trtllm by itself.";
/// What a failed multicast call usually means on one node.
inline constexpr const char* kMulticastSwitchCheck =
    "every rank's GPU sits on an NVSwitch with NVLink multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 1) and "
    "nvidia-fabricmanager is running (systemctl status nvidia-fabricmanager; nvidia-smi -q shows the GPU fabric "
    "state Completed)";
/// What fabric handles need (always across nodes).
inline constexpr const char* kFabricCheck =
    "the IMEX service runs on every node (systemctl status nvidia-imex) and this process can open an IMEX channel "
    "(/dev/nvidia-caps-imex-channels/channel0 exists and is mounted into the container)";
/// What POSIX file-descriptor handles passed over a Unix socket need.
inline constexpr const char* kSocketCheck =
    "all ranks of the group reached workspace creation, and their processes run on one node in one network "
    "namespace (abstract Unix sockets exist per network namespace: docker --network=host, or one pod)";

/// Throws fiar::multicast_error "fiar: <call> on device <d> failed: <CUresult>. Check: <check>. <fallback>".
inline void multicast_check(CUresult r, const std::string& call, int device, const std::string& check) {
  if (r == CUDA_SUCCESS) return;
  throw multicast_error("fiar: " + call + " on device " + std::to_string(device) + " failed: " + cu_result_text(r) +
                            ". Check: " + check + ". " + kMulticastFallback,
                        static_cast<int>(r));
}

inline const char* handle_type_name(CUmemAllocationHandleType type) {
  return type == CU_MEM_HANDLE_TYPE_FABRIC ? "fabric" : "POSIX file descriptor";
}

/// "fiar-mc-<group id>-<rank>", the abstract socket on which a rank hands out its handles.
inline std::string handle_socket_name(std::uint64_t group, int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "fiar-mc-%016llx-%d", static_cast<unsigned long long>(group), rank);
  return name;
}

/// A failure of the descriptor exchange (runtime/posix.hpp) as the multicast_error every rank raises.
[[noreturn]] inline void throw_handle_exchange_failure(const PosixError& e, std::chrono::milliseconds timeout) {
  const std::string check = e.error() == EADDRINUSE
                                ? "no other process on this machine holds this socket name (group ids are random: "
                                  "create the workspace again)"
                                : std::string(kSocketCheck);
  throw multicast_error(std::string(e.what()) +
                            (e.timed_out() ? ", after waiting " + std::to_string(timeout.count()) + " ms" : "") +
                            ". Check: " + check + ". " + kMulticastFallback,
                        static_cast<int>(e.timed_out() ? CUDA_ERROR_TIMEOUT : CUDA_ERROR_OPERATING_SYSTEM));
}

// ---- the collective setup, phase by phase -------------------------------------------------------------------

/// What every rank publishes first: its capabilities, granularities and where it runs.
struct MulticastProbe {
  std::int32_t device;
  std::int32_t fabric;  ///< 1 when this rank can create fabric-handle memory
  std::int64_t pid;     ///< which process and kernel the rank runs under (ProcessIdentity): the plan groups ranks
  std::uint64_t pid_namespace;  ///< into processes (shared handles) and nodes (fabric handles needed) by them
  std::uint64_t boot;
  std::uint64_t group_id;        ///< rank 0's names the group
  std::uint64_t bytes;           ///< requested
  std::uint64_t granularity[2];  ///< [0] POSIX fd handles, [1] fabric handles (0: unusable)
  std::array<char, 32> pci_bus_id;
  std::array<char, 256> fabric_note;  ///< why fabric handles cannot be used ("" when they can)

  /// A probe that says where this rank runs (process and kernel), before anything is probed: set even when the
  /// probe step fails, because the plan of every rank reads every rank's identity.
  static MulticastProbe of_this_process() {
    MulticastProbe p{};
    const ProcessIdentity id = this_process();
    p.pid = id.pid;
    p.pid_namespace = id.pid_namespace;
    p.boot = id.boot;
    return p;
  }
};

/// What every rank publishes second: its handles (raw for its own process; fabric bytes for others).
struct MulticastExport {
  std::uint64_t memory_handle;
  std::uint64_t multicast_handle;  ///< rank 0
  CUmemFabricHandle memory_fabric;
  CUmemFabricHandle multicast_fabric;  ///< rank 0
};

/// One rank's side of CudaPlatform::allocate_multicast. The platform runs the phases between collectives (each
/// phase's failure is exchanged so that every rank throws); resources land in `owned` as soon as they exist.
class MulticastSetup {
 public:
  MulticastSetup(MulticastResources& owned, int rank, int world, std::chrono::milliseconds timeout)
      : owned_(owned), rank_(rank), world_(world), timeout_(timeout) {}
  MulticastSetup(const MulticastSetup&) = delete;
  MulticastSetup& operator=(const MulticastSetup&) = delete;
  ~MulticastSetup() {
    for (int slot : published_) AllocationRegistry::erase(group_, slot);
  }

  /// Phase 1 (local): the device must support multicast; reads what the plan needs.
  void probe(int device, const std::string& pci_bus_id, std::size_t bytes, MulticastProbe& out) {
    device_ = device;
    owned_.set_device(device);
    out.device = device;
    out.bytes = bytes;
    out.group_id = random_id();
    copy_text(out.pci_bus_id, pci_bus_id);
    if (timeout_.count() <= 0) {
      throw std::invalid_argument(
          "fiar: CudaPlatformOptions::handle_exchange_timeout = " + std::to_string(timeout_.count()) +
          " ms; allowed: more than 0 ms. Fix: pass a positive timeout (default 30 s).");
    }
    const VmmDriver& cu = vmm_driver();
    if (cu.missing != nullptr) {
      const bool mc = cu.missing_version >= 12010;
      throw multicast_error(std::string("fiar: the CUDA driver does not provide ") + cu.missing +
                                " (cudaGetDriverEntryPointByVersion found no version of it for CUDA " +
                                (mc ? "12.1" : "12.0") + "); NVLink multicast needs a driver for CUDA 12.1 or newer " +
                                "(R530 or later). Check: the driver version (nvidia-smi); update the driver. " +
                                kMulticastFallback,
                            static_cast<int>(CUDA_ERROR_NOT_FOUND));
    }
    const std::string on = "device " + std::to_string(device);
    multicast_check(cu.device_get(&dev_, device), "cuDeviceGet", device,
                    "the device is visible and healthy (nvidia-smi)");
    int multicast = 0;
    multicast_check(cu.device_get_attribute(&multicast, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev_),
                    "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)", device,
                    "the device is healthy (nvidia-smi)");
    if (multicast == 0) {
      throw multicast_error(
          "fiar: " + on + " (" + pci_bus_id +
              ") does not support NVLink multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0), which the mnnvl "
              "backend needs. Multicast needs sm_90 or newer GPUs on an NVSwitch (HGX/DGX H100, H200, B200; GB200 "
              "NVL72) with nvidia-fabricmanager running; GPUs joined by NVLink bridges or PCIe have none. Fix: use "
              "the trtllm backend on one node or nccl across nodes (FIAR_ALLREDUCE_BACKEND=trtllm or nccl); on "
              "one node, Backend::Auto falls back to trtllm by itself.",
          static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
    }
    out.granularity[0] = granularity_for(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, bytes);
    // Fabric handles: the attribute, then a real allocation (the attribute is 1 on drivers that support the
    // handle type even where no IMEX channel exists, and then only cuMemCreate tells).
    int fabric = 0;
    if (cu.device_get_attribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev_) != CUDA_SUCCESS ||
        fabric == 0) {
      copy_text(out.fabric_note, "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0 on " + on);
      return;
    }
    try {
      const std::size_t g = granularity_for(CU_MEM_HANDLE_TYPE_FABRIC, bytes);
      const CUmemAllocationProp prop = allocation_prop(CU_MEM_HANDLE_TYPE_FABRIC);
      std::size_t smallest = 0;  // the trial allocation: as small as the driver allows
      if (cu.mem_get_allocation_granularity(&smallest, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
          smallest == 0) {
        smallest = g;
      }
      CUmemGenericAllocationHandle trial{};
      const CUresult r = cu.mem_create(&trial, smallest, &prop, 0);
      if (r != CUDA_SUCCESS) {
        copy_text(out.fabric_note, "cuMemCreate with fabric handles failed on " + on + ": " + cu_result_text(r));
        return;
      }
      (void)cu.mem_release(trial);
      out.granularity[1] = g;
      out.fabric = 1;
    } catch (const multicast_error& e) {
      copy_text(out.fabric_note, e.what());
    }
  }

  /// Phase 1 (every rank alike, from the gathered probes): handle type, size, group, process layout. Throws the
  /// same exception on every rank, since every rank computes it from the same records.
  void plan(const std::vector<MulticastProbe>& all) {
    world_ = static_cast<int>(all.size());
    for (int r = 1; r < world_; ++r) {
      if (all[r].bytes != all[0].bytes) {
        throw std::invalid_argument("fiar: allocate_multicast sizes differ: rank 0 asked for " +
                                    std::to_string(all[0].bytes) + " bytes, rank " + std::to_string(r) + " for " +
                                    std::to_string(all[r].bytes) +
                                    ". Fix: create the workspace with the same configuration on every rank.");
      }
    }
    process_of_.assign(all.size(), 0);
    process_count_ = 0;
    for (int r = 0; r < world_; ++r) {
      int q = 0;
      while (q < r && !(all[q].pid == all[r].pid && all[q].pid_namespace == all[r].pid_namespace &&
                        all[q].boot == all[r].boot)) {
        ++q;
      }
      process_of_[r] = q;
      if (q == r) ++process_count_;
    }
    for (int r = 0; r < world_; ++r) {
      for (int q = 0; q < r; ++q) {
        if (all[q].boot == all[r].boot && std::strncmp(all[q].pci_bus_id.data(), all[r].pci_bus_id.data(), 32) == 0) {
          throw multicast_error(
              "fiar: ranks " + std::to_string(q) + " and " + std::to_string(r) + " both run on GPU " +
                  all[r].pci_bus_id.data() +
                  "; a multicast team needs one rank per GPU. Fix: run one rank per GPU (CUDA_VISIBLE_DEVICES, or "
                  "cudaSetDevice before creating the workspace), or use the trtllm backend, which lets ranks share "
                  "a GPU.",
              static_cast<int>(CUDA_ERROR_INVALID_DEVICE));
        }
      }
    }
    int other_node = -1;
    for (int r = 1; r < world_ && other_node < 0; ++r) {
      if (all[r].boot != all[0].boot) other_node = r;
    }
    bool all_fabric = true;
    std::string without;
    for (int r = 0; r < world_; ++r) {
      if (all[r].fabric != 0) continue;
      all_fabric = false;
      without += (without.empty() ? "rank " : "; rank ") + std::to_string(r) + ": " + all[r].fabric_note.data();
    }
    if (other_node >= 0 && !all_fabric) {
      throw multicast_error(
          "fiar: the group spans nodes (rank 0 and rank " + std::to_string(other_node) +
              " run under different kernels), so every rank must share its memory as a fabric handle, but not "
              "every rank can (" +
              without + "). Check: " + kFabricCheck +
              ", and the driver supports CU_MEM_HANDLE_TYPE_FABRIC (GB200 NVL72 class systems). Fix: otherwise use "
              "the nccl backend across nodes (FIAR_ALLREDUCE_BACKEND=nccl); Backend::Auto does not fall back across "
              "nodes (trtllm cannot span them).",
          static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
    }
    multi_process_ = process_count_ > 1;
    // Within one process no handle leaves the process: POSIX fds (always available) are never even exported.
    use_fabric_ = multi_process_ && all_fabric;
    type_ = use_fabric_ ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    granularity_ = 1;
    for (const MulticastProbe& p : all) granularity_ = std::lcm(granularity_, p.granularity[use_fabric_ ? 1 : 0]);
    const std::size_t bytes = std::max<std::size_t>(all[0].bytes, 1);
    size_ = (bytes + granularity_ - 1) / granularity_ * granularity_;
    group_ = all[0].group_id;
  }

  /// Phase 2 (local): this rank's physical memory; rank 0 also creates the multicast object. Exports what other
  /// processes need (fabric bytes into `out`; POSIX fds kept here, with the listening socket that hands them out).
  void create_and_export(MulticastExport& out) {
    const VmmDriver& cu = vmm_driver();
    const CUmemAllocationProp prop = allocation_prop(type_);
    const std::string type = handle_type_name(type_);
    CUmemGenericAllocationHandle memory{};
    multicast_check(cu.mem_create(&memory, size_, &prop, 0),
                    "cuMemCreate(" + std::to_string(size_) + " bytes, " + type + " handles)", device_,
                    use_fabric_ ? "free GPU memory (nvidia-smi); " + std::string(kFabricCheck)
                                : std::string("free GPU memory (nvidia-smi); lower max_token_num or hidden_dim"));
    own_ = std::make_shared<const SharedAllocation>(memory);
    owned_.hold(own_);
    publish(rank_, own_);
    out.memory_handle = memory;
    if (multi_process_) {
      own_fd_ = export_handle(memory, "this rank's memory", out.memory_fabric);
      if (!use_fabric_) {
        try {
          listener_ = listen_abstract(handle_socket_name(group_, rank_), world_);
        } catch (const PosixError& e) {
          throw_handle_exchange_failure(e, timeout_);
        }
      }
    }
    if (rank_ != 0) return;
    const CUmulticastObjectProp mp = multicast_prop(type_, size_);
    CUmemGenericAllocationHandle mc{};
    multicast_check(cu.multicast_create(&mc, &mp),
                    "cuMulticastCreate(" + std::to_string(world_) + " devices, " + std::to_string(size_) + " bytes, " +
                        type + " handles)",
                    device_, kMulticastSwitchCheck);
    multicast_ = std::make_shared<const SharedAllocation>(mc);
    owned_.hold(multicast_);
    publish(kMulticastSlot, multicast_);
    out.multicast_handle = mc;
    if (multi_process_) multicast_fd_ = export_handle(mc, "the multicast object", out.multicast_fabric);
  }

  /// Phase 3: the first rank of each process imports the other processes' handles once for its process (fabric
  /// bytes from the records, or fds received over the peers' sockets) while every rank hands its own fds out.
  void import_handles(const std::vector<MulticastExport>& all) {
    if (!multi_process_) return;
    const Deadline deadline = std::chrono::steady_clock::now() + timeout_;
    std::string server_error;
    int server_status = 0;
    std::thread server;
    std::vector<int> fds;
    if (!use_fabric_) {
      fds.push_back(own_fd_.get());
      if (rank_ == 0) fds.push_back(multicast_fd_.get());
      server = std::thread([&] {
        try {
          serve_fds(listener_.get(), handle_socket_name(group_, rank_), group_, rank_, fds, process_count_ - 1,
                    deadline);
        } catch (const PosixError& e) {
          try {
            throw_handle_exchange_failure(e, timeout_);
          } catch (const multicast_error& m) {
            server_error = m.what();
            server_status = m.status();
          }
        } catch (const std::exception& e) {
          server_error = e.what();
          server_status = static_cast<int>(CUDA_ERROR_UNKNOWN);
        }
      });
    }
    std::exception_ptr failure;
    try {
      if (process_of_[rank_] == rank_) import_for_process(all, deadline);
    } catch (...) {
      failure = std::current_exception();
    }
    if (server.joinable()) server.join();  // bounded: the server gives up at the deadline
    if (failure) std::rethrow_exception(failure);
    if (!server_error.empty()) throw multicast_error(server_error, server_status);
  }

  /// Phase 4: this rank's device joins the multicast team (every rank must have joined before any binds).
  void add_device() {
    if (!multicast_) {
      multicast_ = find_published(kMulticastSlot, "the group's multicast object");
      owned_.hold(multicast_);
    }
    multicast_check(vmm_driver().multicast_add_device(multicast_->handle, dev_),
                    "cuMulticastAddDevice(the group's multicast object)", device_, kMulticastSwitchCheck);
  }

  /// Phase 5: binds this rank's memory, maps the multicast object and every rank's memory for this device, and
  /// zero-fills this rank's memory (on `stream`, synchronized).
  MulticastRegion bind_and_map(cudaStream_t stream) {
    const VmmDriver& cu = vmm_driver();
    multicast_check(cu.multicast_bind_mem(multicast_->handle, 0, own_->handle, 0, size_, 0),
                    "cuMulticastBindMem(" + std::to_string(size_) + " bytes of this rank's memory)", device_,
                    std::string(kMulticastSwitchCheck) +
                        "; CUDA_ERROR_SYSTEM_NOT_READY: the fabric manager (or IMEX) is not running; "
                        "CUDA_ERROR_OUT_OF_MEMORY: the switch has no multicast resources left (fewer "
                        "workspaces at once)");
    owned_.add_binding(multicast_, dev_, size_);
    MulticastRegion region;
    region.view.address = map_here(multicast_->handle, "the multicast object");
    region.view.members = nullptr;
    region.view.member_count = 0;
    region.peers.assign(static_cast<std::size_t>(world_), nullptr);
    for (int r = 0; r < world_; ++r) {
      AllocationRef memory = r == rank_ ? own_ : find_published(r, "the memory of rank " + std::to_string(r));
      if (r != rank_) owned_.hold(memory);
      region.peers[static_cast<std::size_t>(r)] = map_here(memory->handle, "the memory of rank " + std::to_string(r));
    }
    std::uint32_t* mine = region.peers[static_cast<std::size_t>(rank_)];
    cuda_check(cudaMemsetAsync(mine, 0, size_, stream), "cudaMemsetAsync (zeroing the multicast workspace)",
               "the device is healthy");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (zeroing the multicast workspace)",
               "the device is healthy; an earlier kernel may have faulted");
    return region;
  }

  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] bool uses_fabric() const { return use_fabric_; }

 private:
  // Exports `handle` (`what`, in messages) for other processes: as fabric bytes into `fabric`, or as a POSIX
  // file descriptor, returned (none for fabric).
  UniqueFd export_handle(CUmemGenericAllocationHandle handle, const std::string& what,
                         CUmemFabricHandle& fabric) const {
    const VmmDriver& cu = vmm_driver();
    if (use_fabric_) {
      multicast_check(cu.mem_export(&fabric, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0),
                      "cuMemExportToShareableHandle(" + what + ", fabric)", device_, kFabricCheck);
      return UniqueFd();
    }
    int fd = -1;
    multicast_check(cu.mem_export(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                    "cuMemExportToShareableHandle(" + what + ", POSIX file descriptor)", device_,
                    "the process may open more files (ulimit -n)");
    return UniqueFd(fd);
  }

  CUmemAllocationProp allocation_prop(CUmemAllocationHandleType type) const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev_;
    prop.requestedHandleTypes = type;
    return prop;
  }
  CUmulticastObjectProp multicast_prop(CUmemAllocationHandleType type, std::size_t bytes) const {
    CUmulticastObjectProp prop{};
    prop.numDevices = static_cast<unsigned int>(world_);
    prop.size = std::max<std::size_t>(bytes, 1);
    prop.handleTypes = static_cast<unsigned long long>(type);
    prop.flags = 0;
    return prop;
  }

  // The multiple every size, offset and mapping of the region honours: the allocation's minimum granularity and
  // the multicast object's recommended one.
  std::size_t granularity_for(CUmemAllocationHandleType type, std::size_t bytes) const {
    const VmmDriver& cu = vmm_driver();
    const std::string what = std::string(handle_type_name(type)) + " handles";
    const CUmemAllocationProp prop = allocation_prop(type);
    std::size_t allocation = 0;
    multicast_check(cu.mem_get_allocation_granularity(&allocation, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                    "cuMemGetAllocationGranularity(" + what + ")", device_, "the device is healthy (nvidia-smi)");
    const CUmulticastObjectProp mp = multicast_prop(type, bytes);
    std::size_t multicast = 0;
    multicast_check(cu.multicast_get_granularity(&multicast, &mp, CU_MULTICAST_GRANULARITY_RECOMMENDED),
                    "cuMulticastGetGranularity(" + std::to_string(world_) + " devices, " + what + ")", device_,
                    kMulticastSwitchCheck);
    return std::lcm(std::max<std::size_t>(allocation, 1), std::max<std::size_t>(multicast, 1));
  }

  void publish(int slot, const AllocationRef& ref) {
    AllocationRegistry::publish(group_, slot, ref);
    published_.push_back(slot);
  }

  AllocationRef find_published(int slot, const std::string& what) const {
    AllocationRef ref = AllocationRegistry::find(group_, slot);
    if (!ref) {
      throw multicast_error(
          "fiar: rank " + std::to_string(rank_) + " found no handle of " + what +
              " in this process. Check: every rank of the group calls the workspace constructor once, in the "
              "same order as its peers; a rank of this process may have failed earlier.",
          static_cast<int>(CUDA_ERROR_NOT_FOUND));
    }
    return ref;
  }

  AllocationRef import_handle(void* os_handle, CUmemAllocationHandleType type, const std::string& what) {
    CUmemGenericAllocationHandle h{};
    multicast_check(vmm_driver().mem_import(&h, os_handle, type),
                    "cuMemImportFromShareableHandle(" + what + ", " + handle_type_name(type) + ")", device_,
                    type == CU_MEM_HANDLE_TYPE_FABRIC
                        ? std::string(kFabricCheck) + "; the ranks are in one NVLink domain"
                        : std::string(kSocketCheck));
    AllocationRef ref = std::make_shared<const SharedAllocation>(h);
    owned_.hold(ref);
    return ref;
  }

  void import_for_process(const std::vector<MulticastExport>& all, Deadline deadline) {
    // POSIX fds: collect every peer's first, so that a failed import here cannot leave a peer's server waiting.
    std::vector<std::vector<UniqueFd>> received(static_cast<std::size_t>(world_));
    if (!use_fabric_) {
      for (int r = 0; r < world_; ++r) {
        if (process_of_[r] != process_of_[rank_]) try {
            received[r] = receive_fds(handle_socket_name(group_, r), group_, r, rank_, r == 0 ? 2 : 1, deadline);
          } catch (const PosixError& e) {
            throw_handle_exchange_failure(e, timeout_);
          }
      }
    }
    auto as_handle = [](const UniqueFd& fd) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())); };
    for (int r = 0; r < world_; ++r) {
      if (process_of_[r] == process_of_[rank_]) continue;
      const std::string memory_of = "the memory of rank " + std::to_string(r);
      if (use_fabric_) {
        CUmemFabricHandle memory = all[r].memory_fabric;
        publish(r, import_handle(&memory, CU_MEM_HANDLE_TYPE_FABRIC, memory_of));
        if (r == 0) {
          CUmemFabricHandle mc = all[0].multicast_fabric;
          multicast_ = import_handle(&mc, CU_MEM_HANDLE_TYPE_FABRIC, "the multicast object of rank 0");
          publish(kMulticastSlot, multicast_);
        }
        continue;
      }
      publish(r, import_handle(as_handle(received[r][0]), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, memory_of));
      if (r == 0) {
        multicast_ = import_handle(as_handle(received[0][1]), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                   "the multicast object of rank 0");
        publish(kMulticastSlot, multicast_);
      }
    }
  }

  // Reserves a range, maps `handle` into it and gives this device read-write access.
  std::uint32_t* map_here(CUmemGenericAllocationHandle handle, const std::string& what) {
    const VmmDriver& cu = vmm_driver();
    CUdeviceptr va = 0;
    multicast_check(cu.mem_address_reserve(&va, size_, granularity_, 0, 0),
                    "cuMemAddressReserve(" + std::to_string(size_) + " bytes for " + what + ")", device_,
                    "the process has virtual address space left (fewer or smaller workspaces)");
    const std::size_t range = owned_.add_range(va, size_);
    multicast_check(cu.mem_map(va, size_, 0, handle, 0), "cuMemMap(" + what + ")", device_, kMulticastSwitchCheck);
    owned_.mark_mapped(range);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    multicast_check(
        cu.mem_set_access(va, size_, &access, 1), "cuMemSetAccess(" + what + ", read-write)", device_,
        "this GPU reaches the owner's GPU over NVLink (nvidia-smi topo -m); " + std::string(kMulticastSwitchCheck));
    return reinterpret_cast<std::uint32_t*>(static_cast<std::uintptr_t>(va));
  }

  MulticastResources& owned_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  int device_ = -1;
  CUdevice dev_ = 0;
  std::vector<int> process_of_;  ///< rank -> lowest rank of its process
  int process_count_ = 1;
  bool multi_process_ = false;
  bool use_fabric_ = false;
  CUmemAllocationHandleType type_ = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t granularity_ = 1;
  std::size_t size_ = 0;
  std::uint64_t group_ = 0;
  AllocationRef own_;
  AllocationRef multicast_;
  std::vector<int> published_;
  UniqueFd own_fd_, multicast_fd_, listener_;
};

}  // namespace detail
FIAR_END_NAMESPACE
