// SPDX-License-Identifier: Apache-2.0
// fiar/platform/cuda.hpp — CudaPlatform: each rank's buffers live on its GPU and every rank maps its peers' (same
// process: the raw pointer, with peer access; other process: CUDA IPC; multicast regions: platform/cuda_multicast.hpp).
// Host-safe header.
// Contract: launch<Op> is declared here and defined in platform/cuda_launch.cuh (nvcc; emitted by
// <fiar/instantiate.cuh>); a failed CUDA call throws fiar::cuda_error after clearing the sticky error; collective steps
// fail on every rank alike (comm/agree.hpp); what it allocates is freed by RAII handles; the destructor never throws.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../exec/atomics.hpp"
#include "../exec/context.hpp"
#include "../exec/operation.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/driver.hpp"
#include "../runtime/posix.hpp"
#include "cuda_multicast.hpp"
#include "region.hpp"

FIAR_BEGIN_NAMESPACE

/// How CudaPlatform launches its kernels.
struct CudaPlatformOptions {
  /// Most blocks of one launch; 0: the SM count divided by the number of this group's ranks on this GPU (at least
  /// 1), so that the kernels of ranks sharing a GPU are all resident at once.
  int max_blocks = 0;
  /// Programmatic dependent launch on sm_90+: the kernel may start while the previous kernel of the stream
  /// finishes, and waits for it (griddepcontrol.wait) before touching any memory.
  bool pdl = true;
  /// Bounds each wait of the multicast setup (allocate_multicast, mnnvl backend) for a peer process's memory
  /// handles on a Unix socket (POSIX file descriptors, one node); more than 0.
  std::chrono::milliseconds handle_exchange_timeout = std::chrono::seconds(30);
};

/// Grid and block of one launch.
using CudaLaunchShape = exec::LaunchShape;

namespace detail {

/// What each rank publishes about its block of shared memory.
struct SharedRecord {
  ProcessIdentity process;
  std::int32_t device;                 ///< CUDA ordinal in the owner's process
  std::uint32_t handle_valid;          ///< 1 when `handle` could be exported
  std::uint64_t pointer;               ///< the block, as the owner's process sees it
  cudaIpcMemHandle_t handle;           ///< CUDA IPC handle of the block (plain bytes)
  std::array<char, 32> pci_bus_id;     ///< physical identity of the GPU, equal across processes
  std::array<char, 512> export_error;  ///< why the handle could not be exported ("" when it could)
};

}  // namespace detail

/// Runs fiar's operations on the calling thread's current CUDA device (the device current when the platform is
/// constructed) and maps the buffers of every rank of the group.
///
/// Sharing memory: ranks in one process use each other's pointers directly (peer access enabled when they are on
/// different GPUs; several ranks on one GPU is the single-GPU test mode). Ranks in other processes are mapped with
/// CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle). IPC was chosen for the one-process-per-GPU case because its
/// handles are plain bytes: they travel over any Bootstrap (an NCCL communicator, MPI, a TCP store) with no
/// Unix-socket rendezvous that can time out or be blocked by a container. The mnnvl backend's multicast regions
/// (allocate_multicast) need cuMem VMM allocations, shared as fabric handles or POSIX file descriptors.
///
/// Teardown: destroy the workspace on every rank only after the last call has finished on every rank (synchronize,
/// then a barrier); a peer still running would write into freed memory.
class CudaPlatform {
 public:
  using Options = CudaPlatformOptions;

  static constexpr const char* name = "cuda";
  static constexpr bool synchronous = false;  ///< launches are asynchronous on the caller's stream

  /// Binds the platform to the calling thread's current device. CUDA failures are not thrown here but by the first
  /// collective (allocate_shared / allocate_multicast), on every rank alike, so that a rank without a usable GPU
  /// cannot leave its peers waiting; a bad option is reported the same way.
  explicit CudaPlatform(const Options& options = {}) : options_(options) {
    init_ = detail::attempt([&] {
      if (options.max_blocks < 0) {
        throw std::invalid_argument("fiar: CudaPlatformOptions::max_blocks = " + std::to_string(options.max_blocks) +
                                    "; allowed: 0 (automatic) or more. Fix: pass 0 or a positive block count.");
      }
      detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice",
                         "that a CUDA driver is installed and a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)");
      const std::string on = " on device " + std::to_string(device_);
      const char* healthy = "the device is healthy (nvidia-smi)";
      int major = 0, minor = 0;
      detail::cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_),
                         "cudaDeviceGetAttribute(MultiProcessorCount)" + on, healthy);
      detail::cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
                         "cudaDeviceGetAttribute(ComputeCapabilityMajor)" + on, healthy);
      detail::cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_),
                         "cudaDeviceGetAttribute(ComputeCapabilityMinor)" + on, healthy);
      arch_ = major * 10 + minor;
      std::array<char, 32> bus{};
      detail::cuda_check(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), device_),
                         "cudaDeviceGetPCIBusId" + on, healthy);
      pci_bus_id_ = bus.data();
      stream_ = detail::make_stream(device_, "fiar platform stream");
    });
  }

  /// Collective: allocates `bytes` of device memory on this rank's GPU (zero-filled) and returns, in rank order,
  /// where each rank's block is seen from this rank. Throws on every rank alike when any rank fails (fiar::cuda_error
  /// naming the rank, the call and the CUDA error).
  template <Bootstrap B>
  std::vector<std::uint32_t*> allocate_shared(B& boot, std::size_t bytes) {
    // Phase 1: allocate and publish.
    detail::SharedRecord mine{};
    mine.process = detail::this_process();
    mine.device = device_;
    detail::copy_text(mine.pci_bus_id, pci_bus_id_);
    // require_ready() raises the constructor's failure, which attempt() records as it was.
    const detail::StepOutcome outcome = detail::attempt([&] {
      require_ready();
      void* block = allocate_zeroed(bytes, shared_, "the workspace",
                                    "free GPU memory (nvidia-smi); lower max_token_num or hidden_dim to shrink the "
                                    "workspace");
      mine.pointer = reinterpret_cast<std::uintptr_t>(block);
      // Only ranks in other processes need the handle; an export failure is theirs to report.
      const cudaError_t exported = cudaIpcGetMemHandle(&mine.handle, block);
      mine.handle_valid = exported == cudaSuccess ? 1 : 0;
      if (exported != cudaSuccess) {
        (void)cudaGetLastError();
        detail::copy_text(mine.export_error, detail::cuda_failure_text("cudaIpcGetMemHandle", exported, ""));
      }
    });
    const auto all = detail::agree(boot, outcome, mine, "allocating the shared workspace");

    // Phase 2: map every peer's block here, then agree that every rank succeeded.
    std::vector<std::uint32_t*> peers(all.size(), nullptr);
    detail::agree_on(boot, "mapping the shared workspace", [&] {
      detail::DeviceGuard guard(device_);
      for (std::size_t r = 0; r < all.size(); ++r) peers[r] = map_peer(static_cast<int>(r), all[r], mine);
    });

    ranks_on_gpu_ = 0;
    for (const auto& record : all) {
      if (std::strncmp(record.pci_bus_id.data(), mine.pci_bus_id.data(), record.pci_bus_id.size()) == 0)
        ++ranks_on_gpu_;
    }
    return peers;
  }

  /// Collective: `bytes` (rounded up to the multicast and allocation granularities) of cuMem memory on this rank's
  /// GPU, bound to one NVLink multicast object of the group. Returns every rank's memory as mapped here (unicast, rank
  /// order; this rank's zero-filled) and the group's multicast mapping (view.address; a store through it lands in
  /// every rank's memory). Rank 0 creates the multicast object; handles reach other processes as fabric handles
  /// through the bootstrap when every rank can use them (required across nodes: IMEX), else as POSIX file
  /// descriptors over Unix sockets (one node; each wait bounded by Options::handle_exchange_timeout); ranks of one
  /// process share handles directly. Throws fiar::multicast_error on every rank alike when any rank cannot take part
  /// (no multicast on its GPU, no fabric handles across nodes, two ranks on one GPU, a failed driver call).
  template <Bootstrap B>
  MulticastRegion allocate_multicast(B& boot, std::size_t bytes) {
    const char* what = "setting NVLink multicast up";
    detail::MulticastSetup setup(multicast_, boot.rank(), boot.size(), options_.handle_exchange_timeout);
    const auto step = [&](auto&& body) {
      return detail::attempt([&] {
        require_ready();
        detail::DeviceGuard guard(device_);
        body();
      });
    };
    // 1. Capabilities, granularities and where each rank runs; then the plan, which every rank derives alike.
    detail::MulticastProbe probe = detail::MulticastProbe::of_this_process();
    const auto probes =
        detail::agree(boot, step([&] { setup.probe(device_, pci_bus_id_, bytes, probe); }), probe, what);
    setup.plan(probes);
    // 2. Memory on every rank, the multicast object on rank 0, exported for other processes.
    detail::MulticastExport exported{};
    const auto exports = detail::agree(boot, step([&] { setup.create_and_export(exported); }), exported, what);
    // 3. Other processes' handles imported (once per process); 4. every device joins the team before any binds;
    // 5. bind, map the multicast object and every rank's memory here, zero this rank's.
    MulticastRegion region;
    detail::agree(boot, step([&] { setup.import_handles(exports); }), what);
    detail::agree(boot, step([&] { setup.add_device(); }), what);
    detail::agree(boot, step([&] { region = setup.bind_and_map(stream_.get()); }), what);
    return region;
  }

  /// Device memory only this rank's kernels use, zero-filled; `what` names it in a failure's message.
  void* allocate_local(std::size_t bytes, const char* what = "protocol state") {
    require_ready();
    return allocate_zeroed(bytes, locals_, what, "free GPU memory (nvidia-smi)");
  }

  /// Memory the kernels write and the host reads without synchronizing (error records), zero-filled: mapped pinned
  /// host memory. The pointer returned works on the host and in kernels alike (unified addressing makes the device
  /// alias equal the host pointer; that is checked).
  void* allocate_host_visible(std::size_t bytes) {
    require_ready();
    detail::DeviceGuard guard(device_);
    const std::size_t rounded = std::max<std::size_t>((bytes + 63) / 64 * 64, 64);
    void* host = nullptr;
    detail::cuda_check(cudaHostAlloc(&host, rounded, cudaHostAllocMapped | cudaHostAllocPortable),
                       "cudaHostAlloc(" + std::to_string(rounded) + " bytes, mapped)",
                       "pinned host memory is available (ulimit -l)");
    host_.emplace_back(host, detail::OnDevice<detail::free_host>{device_});
    std::memset(host, 0, rounded);
    void* alias = nullptr;
    detail::cuda_check(cudaHostGetDevicePointer(&alias, host, 0), "cudaHostGetDevicePointer",
                       "the device can map host memory (cudaDevAttrCanMapHostMemory)");
    if (alias != host) {
      throw cuda_error("fiar: the device alias of mapped host memory (" + detail::pointer_text(alias) +
                           ") differs from its host address (" + detail::pointer_text(host) +
                           "): fiar needs unified virtual addressing (64-bit Linux, any GPU fiar supports).",
                       static_cast<int>(cudaErrorNotSupported));
    }
    return host;
  }

  /// Fills this rank's own device memory with a 32-bit pattern (cuMemsetD32Async, fetched through cudart), on the
  /// platform's stream; synchronize() waits for it.
  void fill_words(std::uint32_t* p, std::size_t words, std::uint32_t value) {
    require_ready();
    using MemsetD32Async = CUresult (*)(CUdeviceptr, unsigned int, std::size_t, CUstream);
    static const auto memset_d32 = detail::driver_entry_point<MemsetD32Async>("cuMemsetD32Async", 12000);
    if (memset_d32 == nullptr) {
      throw cuda_error(
          "fiar: the CUDA driver does not provide cuMemsetD32Async (cudaGetDriverEntryPointByVersion found nothing). "
          "Check: the driver supports CUDA 12 or newer (nvidia-smi).",
          static_cast<int>(cudaErrorSymbolNotFound));
    }
    detail::DeviceGuard guard(device_);
    const CUresult r =
        memset_d32(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)), value, words, stream_.get());
    if (r != CUDA_SUCCESS) {
      throw cuda_error("fiar: cuMemsetD32Async(" + std::to_string(words) + " words) on device " +
                           std::to_string(device_) + " failed with " + detail::cu_result_text(r) +
                           ". Check: the pointer is this rank's device memory and the device is healthy.",
                       static_cast<int>(r));
    }
  }

  /// Reads a word the kernels write (host-visible memory), without synchronizing.
  static std::uint32_t read_word(const std::uint32_t* p) { return exec::SystemAtomics::load_acquire(p); }

  /// Throws std::invalid_argument unless `p` is device memory of this rank's GPU, or managed memory. The last few
  /// accepted pointers are remembered, so the steady state of an inference loop (the same activation buffers every
  /// step) costs no driver call per all-reduce.
  void check_pointer(const void* p, const char* name) const {
    for (const void* known : accepted_) {
      if (known == p) return;
    }
    check_pointer_uncached(p, name);
    accepted_[next_accepted_] = p;
    next_accepted_ = (next_accepted_ + 1) % accepted_.size();
  }

  /// Launches operation Op on `stream` with Op's shape for this platform's limits (defined in
  /// platform/cuda_launch.cuh, emitted for every fiar operation by <fiar/instantiate.cuh>: a program that launches on
  /// CudaPlatform compiles that header in one nvcc translation unit per linked module). Hidden: a shared object
  /// always launches its own kernels, never another object's.
  template <exec::Operation Op>
  [[gnu::visibility("hidden")]] void launch(const typename Op::Params& p, cudaStream_t stream);

  /// What one launch may use: at most max_blocks() blocks.
  [[nodiscard]] exec::LaunchLimits limits() const { return exec::LaunchLimits{max_blocks()}; }

  /// Grid, block and cluster of fiar's per-token launches (exec::spread_shape): a cluster of blocks per token, at
  /// most max_blocks() blocks (at least one cluster), threads a multiple of 32 covering the cluster's share of one
  /// token's 16-byte vectors (32 to 1024).
  [[nodiscard]] CudaLaunchShape launch_shape(int num_tokens, int vecs_per_token) const {
    return launch_shape(num_tokens, vecs_per_token, max_blocks());
  }
  static constexpr CudaLaunchShape launch_shape(int num_tokens, int vecs_per_token, int max_blocks) {
    return exec::spread_shape(num_tokens, vecs_per_token, max_blocks);
  }

  /// Most blocks per launch: the option, or the SM count shared by this group's ranks on this GPU.
  [[nodiscard]] int max_blocks() const {
    return options_.max_blocks > 0 ? options_.max_blocks : std::max(1, sm_count_ / std::max(1, ranks_on_gpu_));
  }

  /// Waits for the platform's own work (zeroing, fills). Kernels run on the caller's streams: synchronize those.
  void synchronize() {
    require_ready();
    detail::DeviceGuard guard(device_);
    detail::cuda_check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (fiar platform stream)",
                       "the device is healthy; an earlier kernel may have faulted");
  }

  /// Which stream a call's cudaStream_t names, as a key two ranks of one process share exactly when they share the
  /// stream: the legacy default stream (nullptr, cudaStreamLegacy) is one per device; the per-thread default stream
  /// is each thread's own (0: never shared); any other handle is itself.
  [[nodiscard]] std::uintptr_t stream_key(cudaStream_t stream) const {
    if (stream == nullptr || stream == cudaStreamLegacy) return (static_cast<std::uintptr_t>(device_) << 1) | 1u;
    if (stream == cudaStreamPerThread) return 0;
    return reinterpret_cast<std::uintptr_t>(stream);
  }

  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] int sm_count() const { return sm_count_; }
  [[nodiscard]] int arch() const { return arch_; }
  /// Ranks of the group on this GPU (known after allocate_shared; 1 before).
  [[nodiscard]] int ranks_on_gpu() const { return ranks_on_gpu_; }
  /// Whether launches ask for programmatic dependent launch (granted when the loaded kernel image is sm_90+).
  [[nodiscard]] bool pdl() const { return options_.pdl && arch_ >= 90; }
  [[nodiscard]] const Options& options() const { return options_; }

 private:
  // cudaMalloc (rounded up to 256 bytes) on this rank's device, zero-filled and synchronized, owned by `owner`.
  // `what` names the memory in error messages; `hint` is what to check when the allocation fails.
  void* allocate_zeroed(std::size_t bytes, std::vector<detail::DeviceMemory>& owner, const std::string& what,
                        const char* hint) {
    detail::DeviceGuard guard(device_);
    const std::size_t rounded = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
    void* p = owner.emplace_back(detail::device_malloc(device_, rounded, what, hint)).get();
    detail::cuda_check(cudaMemsetAsync(p, 0, rounded, stream_.get()), "cudaMemsetAsync (zeroing " + what + ")",
                       "the device is healthy");
    detail::cuda_check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (zeroing " + what + ")",
                       "the device is healthy; an earlier kernel may have faulted");
    return p;
  }

  void require_ready() const {
    if (init_.failed()) detail::raise(init_, init_.message());
    if (!stream_) throw std::logic_error(detail::moved_from_text("CudaPlatform"));
  }

  void check_pointer_uncached(const void* p, const char* name) const {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    std::string what;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      what = "not memory CUDA can classify (" + detail::describe_cuda(e) + ")";
    } else if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device_)) {
      return;
    } else if (a.type == cudaMemoryTypeDevice) {
      what = "device memory of CUDA device " + std::to_string(a.device);
    } else if (a.type == cudaMemoryTypeHost) {
      what = "pinned host memory (cudaHostAlloc / cudaHostRegister)";
    } else {
      what = "host memory (not allocated by CUDA)";
    }
    throw std::invalid_argument("fiar: " + std::string(name) + " = " + detail::pointer_text(p) + " is " + what +
                                "; it must be device memory on this rank's device " + std::to_string(device_) +
                                " (or managed memory). Fix: allocate the tensor on device " + std::to_string(device_) +
                                " (cudaMalloc / cudaMallocAsync), or make that device current when creating the "
                                "workspace.");
  }

  // Where rank r's block is seen from this rank (the calling thread's current device is device_).
  std::uint32_t* map_peer(int r, const detail::SharedRecord& peer, const detail::SharedRecord& mine) {
    const std::string who =
        "rank " + std::to_string(r) + " (device " + std::to_string(peer.device) + ", " + peer.pci_bus_id.data() + ")";
    if (peer.process == mine.process) {
      if (peer.device != device_) {
        int can = 0;
        detail::cuda_check(
            cudaDeviceCanAccessPeer(&can, device_, peer.device),
            "cudaDeviceCanAccessPeer(" + std::to_string(device_) + ", " + std::to_string(peer.device) + ")",
            "both devices are visible to this process");
        if (can == 0) {
          throw cuda_error("fiar: device " + std::to_string(device_) + " cannot access the memory of " + who +
                               " (no peer-to-peer path). Check: nvidia-smi topo -m shows NVLink or a P2P-capable PCIe "
                               "path between them; otherwise use the nccl backend.",
                           static_cast<int>(cudaErrorPeerAccessUnsupported));
        }
        const cudaError_t e = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
        } else {
          detail::cuda_check(
              e, "cudaDeviceEnablePeerAccess(" + std::to_string(peer.device) + ") on device " + std::to_string(device_),
              "peer access between the two devices (nvidia-smi topo -m)");
        }
      }
      return reinterpret_cast<std::uint32_t*>(static_cast<std::uintptr_t>(peer.pointer));
    }
    if (peer.handle_valid == 0) {
      throw cuda_error("fiar: " + who + " runs in another process but could not export its workspace: " +
                           detail::without_fiar_prefix(peer.export_error.data()),
                       static_cast<int>(cudaErrorInvalidResourceHandle));
    }
    void* p = nullptr;
    detail::cuda_check(cudaIpcOpenMemHandle(&p, peer.handle, cudaIpcMemLazyEnablePeerAccess),
                       "cudaIpcOpenMemHandle (the workspace of " + who + ") on device " + std::to_string(device_),
                       "the ranks run on one node, in one IPC namespace (docker --ipc=host), and the devices have a "
                       "peer-to-peer path (nvidia-smi topo -m)");
    ipc_opened_.emplace_back(p, detail::OnDevice<detail::close_ipc>{device_});
    return static_cast<std::uint32_t*>(p);
  }

  Options options_;
  int device_ = -1;
  int sm_count_ = 0;
  int arch_ = 0;
  int ranks_on_gpu_ = 1;
  std::string pci_bus_id_;
  detail::StepOutcome init_;  ///< the constructor's failure, raised by the first collective (on every rank)
  // Pointers check_pointer accepted (a small ring; nullptr never matches a checked pointer).
  mutable std::array<const void*, 8> accepted_{};
  mutable std::size_t next_accepted_ = 0;
  // Released in reverse order: multicast mappings, host, local and shared memory, peers' IPC mappings, the stream.
  detail::StreamHandle stream_;  ///< the platform's own stream (null once moved from)
  std::vector<detail::IpcMapping> ipc_opened_;
  std::vector<detail::DeviceMemory> shared_, locals_;
  std::vector<detail::PinnedHostMemory> host_;
  detail::MulticastResources multicast_;  ///< allocate_multicast's mappings, bindings and allocations
};

FIAR_END_NAMESPACE
