// fiar/platform_cuda.hpp — CudaPlatform: each rank's buffers live on its GPU and every rank maps its peers'
// (same process: the raw pointer, with peer access; other process: CUDA IPC). Host-safe header.
// Contract: launch<T> is defined in <fiar/cuda/kernels.cuh> (nvcc); a failed CUDA call throws fiar::cuda_error
// after clearing the sticky error; collective failures throw on every rank alike; the destructor never throws.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "algo/lamport.hpp"
#include "algo/memory.hpp"
#include "bootstrap.hpp"
#include "detail/cuda_check.hpp"
#include "detail/cuda_multicast.hpp"
#include "detail/cuda_probe.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "version.hpp"

namespace fiar::inline v0_1 {

/// How CudaPlatform launches its kernels.
struct CudaPlatformOptions {
  /// Most blocks of one launch; 0: the SM count divided by the number of this group's ranks on this GPU
  /// (at least 1), so that the kernels of ranks sharing a GPU are all resident at once.
  int max_blocks = 0;
  /// Programmatic dependent launch on sm_90+: the kernel may start while the previous kernel of the stream
  /// finishes, and waits for it (griddepcontrol.wait) before touching any memory.
  bool pdl = true;
  /// Bounds each wait of the multicast setup (allocate_multicast, mnnvl backend) for a peer process's memory
  /// handles on a Unix socket (POSIX file descriptors, one node); more than 0.
  std::chrono::milliseconds handle_exchange_timeout = std::chrono::seconds(30);
};

/// Grid and block of one launch.
struct CudaLaunchShape {
  int blocks;
  int threads;
};

namespace detail {

/// Which process a rank runs in. A pid alone is ambiguous: two containers on one machine can each have a
/// process with the same pid, so the pid namespace and the kernel's boot id are part of it.
struct ProcessIdentity {
  std::int64_t pid = 0;
  std::uint64_t pid_namespace = 0;
  std::uint64_t boot = 0;
  friend bool operator==(const ProcessIdentity&, const ProcessIdentity&) = default;
};

inline ProcessIdentity this_process() {
  ProcessIdentity id;
  id.pid = static_cast<std::int64_t>(::getpid());
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) id.pid_namespace = static_cast<std::uint64_t>(ns.st_ino);
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::string line;
  if (boot_id && std::getline(boot_id, line)) {
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a
    for (unsigned char c : line) h = (h ^ c) * 1099511628211ull;
    id.boot = h;
  }
  return id;
}

/// What each rank publishes about its block of shared memory (exchanged over the Bootstrap as bytes).
struct SharedRecord {
  ProcessIdentity process;
  std::int32_t device;  ///< CUDA ordinal in the owner's process
  std::int32_t status;  ///< cudaError_t of the owner's failure, 0 when none
  std::int32_t kind;    ///< FailureKind of the owner's failure
  std::int32_t reserved0;
  std::uint64_t pointer;       ///< the block, as the owner's process sees it
  std::uint32_t handle_valid;  ///< 1 when `handle` could be exported
  std::uint32_t reserved;
  cudaIpcMemHandle_t handle;        ///< CUDA IPC handle of the block (plain bytes)
  std::array<char, 32> pci_bus_id;  ///< physical identity of the GPU, equal across processes
  std::array<char, 512> error;      ///< why the owner failed ("" when it did not)
};

template <std::size_t N>
void copy_message(std::array<char, N>& to, const std::string& from) {
  to.fill('\0');
  std::memcpy(to.data(), from.data(), std::min(from.size(), N - 1));
}

/// The outcome of the second (mapping) phase on one rank.
struct MapStatus {
  std::int32_t status;
  std::int32_t kind;
  std::array<char, 512> error;
};

/// What a rank's failure was, so that every rank rethrows the same exception type.
enum FailureKind : std::int32_t {
  kNoFailure = 0,
  kCudaFailure = 1,
  kInvalidArgument = 2,
  kOtherFailure = 3,
  kMulticastFailure = 4,
  kTimeoutFailure = 5,  ///< a bounded wait of the step expired (the nccl workspace's creation)
};

/// Runs `step`; a failure is written into (status, kind, error) instead of thrown.
template <class F, std::size_t N>
void capture_failure(F&& step, std::int32_t& status, std::int32_t& kind, std::array<char, N>& error) {
  try {
    step();
  } catch (const multicast_error& e) {
    status = e.status() == 0 ? -1 : e.status();
    kind = kMulticastFailure;
    copy_message(error, e.what());
  } catch (const cuda_error& e) {
    status = e.status() == 0 ? -1 : e.status();
    kind = kCudaFailure;
    copy_message(error, e.what());
  } catch (const std::invalid_argument& e) {
    status = -1;
    kind = kInvalidArgument;
    copy_message(error, e.what());
  } catch (const timeout_error& e) {
    status = -1;
    kind = kTimeoutFailure;
    copy_message(error, e.what());
  } catch (const std::exception& e) {
    status = -1;
    kind = kOtherFailure;
    copy_message(error, e.what());
  }
}

/// Throws on every rank alike when any rank failed a collective step: its own error on the failing rank,
/// "<what> failed on rank r: ..." on the others.
template <class Record>
void rethrow_first_failure(const std::vector<Record>& all, int me, const char* what) {
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].kind == kNoFailure) continue;
    std::string own(all[r].error.data());
    if (static_cast<int>(r) != me && own.rfind("fiar: ", 0) == 0) own.erase(0, 6);
    const std::string text = static_cast<int>(r) == me
                                 ? own
                                 : "fiar: " + std::string(what) + " failed on rank " + std::to_string(r) + ": " + own;
    if (all[r].kind == kInvalidArgument) throw std::invalid_argument(text);
    if (all[r].kind == kMulticastFailure) throw multicast_error(text, all[r].status);
    if (all[r].kind == kCudaFailure) throw cuda_error(text, all[r].status);
    if (all[r].kind == kTimeoutFailure) throw timeout_error(text);
    throw std::runtime_error(text);
  }
}

}  // namespace detail

/// Runs fiar's kernels on the calling thread's current CUDA device (the device current when the platform
/// is constructed) and maps the buffers of every rank of the group.
///
/// Sharing memory: ranks in one process use each other's pointers directly (peer access enabled when they
/// are on different GPUs; several ranks on one GPU is the single-GPU test mode). Ranks in other processes
/// are mapped with CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle). IPC was chosen for the
/// one-process-per-GPU case because its handles are plain bytes: they travel over any Bootstrap (an NCCL
/// communicator, MPI, a TCP store) with no Unix-socket rendezvous that can time out or be blocked by a
/// container. The mnnvl backend's multicast regions (allocate_multicast) need cuMem VMM allocations, shared as
/// fabric handles or POSIX file descriptors (detail/cuda_multicast.hpp).
///
/// Teardown: destroy the workspace on every rank only after the last call has finished on every rank
/// (synchronize, then a barrier); a peer still running would write into freed memory.
struct CudaPlatform {
 public:
  using Options = CudaPlatformOptions;

  static constexpr const char* name = "cuda";
  static constexpr bool synchronous = false;  ///< launches are asynchronous on the caller's stream

  /// Binds the platform to the calling thread's current device. CUDA failures are not thrown here but by the
  /// first collective (allocate_shared), on every rank alike, so that a rank without a usable GPU cannot
  /// leave its peers waiting; a bad option is reported the same way.
  explicit CudaPlatform(const Options& options = {}) : options_(options) {
    try {
      if (options.max_blocks < 0) {
        throw std::invalid_argument("fiar: CudaPlatformOptions::max_blocks = " + std::to_string(options.max_blocks) +
                                    "; allowed: 0 (automatic) or more. Fix: pass 0 or a positive block count.");
      }
      detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice",
                         "that a CUDA driver is installed and a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)");
      const std::string on = " on device " + std::to_string(device_);
      int major = 0, minor = 0;
      detail::cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_),
                         "cudaDeviceGetAttribute(MultiProcessorCount)" + on, "the device is healthy (nvidia-smi)");
      detail::cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
                         "cudaDeviceGetAttribute(ComputeCapabilityMajor)" + on, "the device is healthy (nvidia-smi)");
      detail::cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_),
                         "cudaDeviceGetAttribute(ComputeCapabilityMinor)" + on, "the device is healthy (nvidia-smi)");
      arch_ = major * 10 + minor;
      std::array<char, 32> bus{};
      detail::cuda_check(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), device_),
                         "cudaDeviceGetPCIBusId" + on, "the device is healthy (nvidia-smi)");
      pci_bus_id_ = bus.data();
      detail::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags" + on,
                         "the device is healthy and not out of resources");
    } catch (const cuda_error& e) {
      init_error_ = e.what();
      init_status_ = e.status();
    } catch (const std::invalid_argument& e) {
      init_error_ = e.what();
      init_status_ = -1;
    }
  }

  CudaPlatform(CudaPlatform&& other) noexcept { take(other); }
  CudaPlatform& operator=(CudaPlatform&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  CudaPlatform(const CudaPlatform&) = delete;
  CudaPlatform& operator=(const CudaPlatform&) = delete;
  ~CudaPlatform() { release(); }

  /// Collective: allocates `bytes` of device memory on this rank's GPU (zero-filled) and returns, in rank
  /// order, where each rank's block is seen from this rank. Throws on every rank alike when any rank fails
  /// (fiar::cuda_error naming the rank, the call and the CUDA error).
  template <Bootstrap B>
  std::vector<std::uint32_t*> allocate_shared(B& boot, std::size_t bytes) {
    // Phase 1: allocate and publish.
    detail::SharedRecord mine{};
    mine.process = detail::this_process();
    mine.device = device_;
    detail::copy_message(mine.pci_bus_id, pci_bus_id_);
    detail::capture_failure(
        [&] {
          require_ready();
          void* block = allocate_zeroed(bytes, shared_, "the workspace",
                                        "free GPU memory (nvidia-smi); lower max_token_num or hidden_dim to shrink "
                                        "the workspace");
          mine.pointer = reinterpret_cast<std::uintptr_t>(block);
          // Only ranks in other processes need the handle; an export failure is theirs to report.
          const cudaError_t exported = cudaIpcGetMemHandle(&mine.handle, block);
          mine.handle_valid = exported == cudaSuccess ? 1 : 0;
          if (exported != cudaSuccess) {
            (void)cudaGetLastError();
            detail::copy_message(mine.error, detail::cuda_failure_text("cudaIpcGetMemHandle", exported, ""));
          }
        },
        mine.status, mine.kind, mine.error);
    const auto all = all_gather_value(boot, mine);
    detail::rethrow_first_failure(all, boot.rank(), "allocating the shared workspace");

    // Phase 2: map every peer's block here, then agree that every rank succeeded.
    std::vector<std::uint32_t*> peers(all.size(), nullptr);
    detail::MapStatus status{};
    detail::capture_failure(
        [&] {
          detail::DeviceGuard guard(device_);
          for (std::size_t r = 0; r < all.size(); ++r) peers[r] = map_peer(static_cast<int>(r), all[r], mine);
        },
        status.status, status.kind, status.error);
    detail::rethrow_first_failure(all_gather_value(boot, status), boot.rank(), "mapping the shared workspace");

    ranks_on_gpu_ = 0;
    for (const auto& record : all) {
      if (std::strncmp(record.pci_bus_id.data(), mine.pci_bus_id.data(), record.pci_bus_id.size()) == 0)
        ++ranks_on_gpu_;
    }
    return peers;
  }

  /// Collective: `bytes` (rounded up to the multicast and allocation granularities) of cuMem memory on this rank's
  /// GPU, bound to one NVLink multicast object of the group. Returns every rank's memory as mapped here (unicast,
  /// rank order; this rank's zero-filled) and the group's multicast mapping (view.address; a store through it
  /// lands in every rank's memory). Rank 0 creates the multicast object; handles reach other processes as fabric
  /// handles through the bootstrap when every rank can use them (required across nodes: IMEX), else as POSIX file
  /// descriptors over Unix sockets (one node; each wait bounded by Options::handle_exchange_timeout); ranks of one
  /// process share handles directly. Throws fiar::multicast_error on every rank alike when any rank cannot take
  /// part (no multicast on its GPU, no fabric handles across nodes, two ranks on one GPU, a failed driver call).
  template <Bootstrap B>
  algo::MulticastRegion allocate_multicast(B& boot, std::size_t bytes) {
    detail::MulticastSetup setup(multicast_, boot.rank(), boot.size(), options_.handle_exchange_timeout);
    const char* what = "setting NVLink multicast up";
    // 1. Capabilities, granularities and where each rank runs; then the plan, which every rank derives alike.
    detail::MulticastProbe probe{};
    const detail::ProcessIdentity process = detail::this_process();
    probe.pid = process.pid;
    probe.pid_namespace = process.pid_namespace;
    probe.boot = process.boot;
    detail::capture_failure(
        [&] {
          require_ready();
          detail::DeviceGuard guard(device_);
          setup.probe(device_, pci_bus_id_, bytes, probe);
        },
        probe.status, probe.kind, probe.error);
    const auto probes = all_gather_value(boot, probe);
    detail::rethrow_first_failure(probes, boot.rank(), what);
    setup.plan(probes);
    // 2. Memory on every rank, the multicast object on rank 0, exported for other processes.
    detail::MulticastExport exported{};
    detail::capture_failure(
        [&] {
          detail::DeviceGuard guard(device_);
          setup.create_and_export(exported);
        },
        exported.status, exported.kind, exported.error);
    const auto exports = all_gather_value(boot, exported);
    detail::rethrow_first_failure(exports, boot.rank(), what);
    // 3. Other processes' handles imported (once per process); 4. every device joins the team before any binds;
    // 5. bind, map the multicast object and every rank's memory here, zero this rank's.
    algo::MulticastRegion region;
    const auto phase = [&](auto&& step) {
      detail::MapStatus status{};
      detail::capture_failure(
          [&] {
            detail::DeviceGuard guard(device_);
            step();
          },
          status.status, status.kind, status.error);
      detail::rethrow_first_failure(all_gather_value(boot, status), boot.rank(), what);
    };
    phase([&] { setup.import_handles(exports); });
    phase([&] { setup.add_device(); });
    phase([&] { region = setup.bind_and_map(stream_); });
    return region;
  }

  /// Device memory only this rank's kernels use (protocol state), zero-filled.
  void* allocate_local(std::size_t bytes) {
    require_ready();
    return allocate_zeroed(bytes, locals_, "protocol state", "free GPU memory (nvidia-smi)");
  }

  /// Memory the kernels write and the host reads without synchronizing (error records), zero-filled:
  /// mapped pinned host memory. The pointer returned works on the host and in kernels alike (unified
  /// addressing makes the device alias equal the host pointer; that is checked).
  void* allocate_host_visible(std::size_t bytes) {
    require_ready();
    detail::DeviceGuard guard(device_);
    const std::size_t rounded = std::max<std::size_t>((bytes + 63) / 64 * 64, 64);
    void* host = nullptr;
    detail::cuda_check(cudaHostAlloc(&host, rounded, cudaHostAllocMapped | cudaHostAllocPortable),
                       "cudaHostAlloc(" + std::to_string(rounded) + " bytes, mapped)",
                       "pinned host memory is available (ulimit -l)");
    host_.push_back(host);
    std::memset(host, 0, rounded);
    void* alias = nullptr;
    detail::cuda_check(cudaHostGetDevicePointer(&alias, host, 0), "cudaHostGetDevicePointer",
                       "the device can map host memory (cudaDevAttrCanMapHostMemory)");
    if (alias != host) {
      throw cuda_error("fiar: the device alias of mapped host memory (" + pointer_text(alias) +
                           ") differs from its host address (" + pointer_text(host) +
                           "): fiar needs unified virtual addressing (64-bit Linux, any GPU fiar supports).",
                       static_cast<int>(cudaErrorNotSupported));
    }
    return host;
  }

  /// Fills this rank's own device memory with a 32-bit pattern (cuMemsetD32Async, fetched through cudart),
  /// on the platform's stream; synchronize() waits for it.
  void fill_words(std::uint32_t* p, std::size_t words, std::uint32_t value) {
    require_ready();
    using MemsetD32Async = CUresult (*)(CUdeviceptr, unsigned int, std::size_t, CUstream);
    static const auto memset_d32 = detail::driver_entry_point<MemsetD32Async>("cuMemsetD32Async", 12000);
    if (memset_d32 == nullptr) {
      throw cuda_error(
          "fiar: the CUDA driver does not provide cuMemsetD32Async (cudaGetDriverEntryPointByVersion "
          "found nothing). Check: the driver supports CUDA 12 or newer (nvidia-smi).",
          static_cast<int>(cudaErrorSymbolNotFound));
    }
    detail::DeviceGuard guard(device_);
    const CUresult r = memset_d32(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)), value, words, stream_);
    if (r != CUDA_SUCCESS) {
      throw cuda_error("fiar: cuMemsetD32Async(" + std::to_string(words) + " words) on device " +
                           std::to_string(device_) + " failed with CUresult " + std::to_string(static_cast<int>(r)) +
                           ". Check: the pointer is this rank's device memory and the device is healthy.",
                       static_cast<int>(r));
    }
  }

  /// Reads a word the kernels write (host-visible memory), without synchronizing.
  static std::uint32_t read_word(const std::uint32_t* p) { return algo::SystemAtomics::load_acquire(p); }

  /// Throws std::invalid_argument unless `p` is device memory of this rank's GPU, or managed memory.
  /// The last few accepted pointers are remembered, so the steady state of an inference loop (the same
  /// activation buffers every step) costs no driver call per all-reduce.
  void check_pointer(const void* p, const char* name) const {
    for (const void* known : accepted_) {
      if (known == p) return;
    }
    check_pointer_uncached(p, name);
    accepted_[next_accepted_] = p;
    next_accepted_ = (next_accepted_ + 1) % accepted_.size();
  }

 private:
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
    throw std::invalid_argument("fiar: " + std::string(name) + " = " + pointer_text(p) + " is " + what +
                                "; it must be device memory on this rank's device " + std::to_string(device_) +
                                " (or managed memory). Fix: allocate the tensor on device " + std::to_string(device_) +
                                " (cudaMalloc / cudaMallocAsync), or make that device current when creating the "
                                "workspace.");
  }

  // Pointers check_pointer accepted (a small ring; nullptr never matches a checked pointer).
  mutable std::array<const void*, 8> accepted_{};
  mutable std::size_t next_accepted_ = 0;

 public:
  /// Launches the trtllm kernel of strategy `s` on `stream` (defined in <fiar/cuda/kernels.cuh>; a program
  /// that uses CudaPlatform compiles at least one translation unit with nvcc that includes <fiar/fiar.cuh>).
  /// Hidden: a shared object always launches its own kernels, never another object's instantiation. Never
  /// inlined: g++ translation units call the instantiation the nvcc one emits, which a short body inlined into
  /// every caller there would leave undefined.
  template <Pattern P, ReduceType T, algo::Transport X = algo::Transport::Unicast>
  [[gnu::visibility("hidden"), gnu::noinline]] void launch(Strategy s, const algo::LamportParams<T>& p,
                                                           cudaStream_t stream);

  /// Grid and block of a launch: one block per token up to max_blocks(), threads a multiple of 32 covering
  /// one token's 16-byte vectors (32 to 1024).
  [[nodiscard]] CudaLaunchShape launch_shape(int num_tokens, int vecs_per_token) const {
    return launch_shape(num_tokens, vecs_per_token, max_blocks());
  }
  static constexpr CudaLaunchShape launch_shape(int num_tokens, int vecs_per_token, int max_blocks) {
    const int threads = std::clamp((vecs_per_token + 31) / 32 * 32, 32, 1024);
    return CudaLaunchShape{std::max(1, std::min(num_tokens, max_blocks)), threads};
  }

  /// Most blocks per launch: the option, or the SM count shared by this group's ranks on this GPU.
  [[nodiscard]] int max_blocks() const {
    return options_.max_blocks > 0 ? options_.max_blocks : std::max(1, sm_count_ / std::max(1, ranks_on_gpu_));
  }

  /// Waits for the platform's own work (zeroing, fills). Kernels run on the caller's streams: synchronize those.
  void synchronize() {
    require_ready();
    detail::DeviceGuard guard(device_);
    detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (fiar platform stream)",
                       "the device is healthy; an earlier kernel may have faulted");
  }

  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] int sm_count() const { return sm_count_; }
  [[nodiscard]] int arch() const { return arch_; }
  /// Ranks of the group on this GPU (known after allocate_shared; 1 before).
  [[nodiscard]] int ranks_on_gpu() const { return ranks_on_gpu_; }
  /// Whether launches carry the programmatic-dependent-launch attribute.
  [[nodiscard]] bool pdl() const { return options_.pdl && arch_ >= 90; }
  [[nodiscard]] const Options& options() const { return options_; }

 private:
  // cudaMalloc (rounded up to 256 bytes) on this rank's device, zero-filled and synchronized, owned by
  // `owner`. `what` names the memory in error messages; `hint` is what to check when the allocation fails.
  void* allocate_zeroed(std::size_t bytes, std::vector<void*>& owner, const std::string& what, const char* hint) {
    detail::DeviceGuard guard(device_);
    const std::size_t rounded = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
    void* p = nullptr;
    detail::cuda_check(cudaMalloc(&p, rounded),
                       "cudaMalloc(" + std::to_string(rounded) + " bytes) on device " + std::to_string(device_), hint);
    owner.push_back(p);
    detail::cuda_check(cudaMemsetAsync(p, 0, rounded, stream_), "cudaMemsetAsync (zeroing " + what + ")",
                       "the device is healthy");
    detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (zeroing " + what + ")",
                       "the device is healthy; an earlier kernel may have faulted");
    return p;
  }

  void require_ready() const {
    if (!init_error_.empty()) {
      if (init_status_ < 0) throw std::invalid_argument(init_error_);
      throw cuda_error(init_error_, init_status_);
    }
    if (stream_ == nullptr) throw std::logic_error("fiar: this CudaPlatform was moved from");
  }

  static std::string pointer_text(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", p);
    return buf;
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
                               " (no peer-to-peer path). Check: nvidia-smi topo -m shows NVLink or a P2P-capable "
                               "PCIe path between them; otherwise use the nccl backend.",
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
      throw cuda_error(
          "fiar: " + who + " runs in another process but could not export its workspace: " + peer.error.data(),
          static_cast<int>(cudaErrorInvalidResourceHandle));
    }
    void* p = nullptr;
    detail::cuda_check(cudaIpcOpenMemHandle(&p, peer.handle, cudaIpcMemLazyEnablePeerAccess),
                       "cudaIpcOpenMemHandle (the workspace of " + who + ") on device " + std::to_string(device_),
                       "the ranks run on one node, in one IPC namespace (docker --ipc=host), and the devices have a "
                       "peer-to-peer path (nvidia-smi topo -m)");
    ipc_opened_.push_back(p);
    return static_cast<std::uint32_t*>(p);
  }

  void take(CudaPlatform& other) noexcept {
    options_ = other.options_;
    device_ = std::exchange(other.device_, -1);
    sm_count_ = other.sm_count_;
    arch_ = other.arch_;
    ranks_on_gpu_ = other.ranks_on_gpu_;
    pci_bus_id_ = std::move(other.pci_bus_id_);
    init_error_ = std::move(other.init_error_);
    init_status_ = other.init_status_;
    stream_ = std::exchange(other.stream_, nullptr);
    shared_ = std::exchange(other.shared_, {});
    ipc_opened_ = std::exchange(other.ipc_opened_, {});
    locals_ = std::exchange(other.locals_, {});
    host_ = std::exchange(other.host_, {});
    multicast_ = std::move(other.multicast_);
    accepted_ = std::exchange(other.accepted_, {});
    next_accepted_ = other.next_accepted_;
  }

  // Frees everything this platform owns; ignores failures (the runtime may be shutting down).
  void release() noexcept {
    if (device_ < 0 ||
        (stream_ == nullptr && shared_.empty() && locals_.empty() && host_.empty() && multicast_.empty()))
      return;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    const bool switched = previous != device_ && cudaSetDevice(device_) == cudaSuccess;
    if (stream_ != nullptr) {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
    multicast_.release();
    for (void* p : ipc_opened_) (void)cudaIpcCloseMemHandle(p);
    for (void* p : shared_) (void)cudaFree(p);
    for (void* p : locals_) (void)cudaFree(p);
    for (void* p : host_) (void)cudaFreeHost(p);
    if (switched && previous >= 0) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    stream_ = nullptr;
    ipc_opened_.clear();
    shared_.clear();
    locals_.clear();
    host_.clear();
  }

  Options options_;
  int device_ = -1;
  int sm_count_ = 0;
  int arch_ = 0;
  int ranks_on_gpu_ = 1;
  std::string pci_bus_id_;
  std::string init_error_;
  int init_status_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> shared_, ipc_opened_, locals_, host_;
  detail::MulticastResources multicast_;  ///< allocate_multicast's mappings, bindings and allocations
};

}  // namespace fiar::inline v0_1
