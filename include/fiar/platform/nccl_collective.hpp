// SPDX-License-Identifier: Apache-2.0
// fiar/platform/nccl_collective.hpp — NcclCollective: ncclAllReduce on CudaPlatform, what the NCCL engine sums with
// on GPUs (platform/host_collective.hpp is the host emulator's).
// Contract: the communicator is created from the bootstrap (owned) or adopted (not owned), each creation step agreed
// by every rank; a symmetric window is registered when every rank can (NCCL 2.27+); every call runs on the caller's
// stream and a host-side watchdog (check()) bounds it: a call not finished after the timeout aborts an owned
// communicator and makes this and every later call throw fiar::timeout_error. NCCL is optional at build time
// (FIAR_HAS_NCCL): without it this compiles and creation_error() says why it cannot be created.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/errors.hpp"
#include "../core/log.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/nccl.hpp"
#include "cuda.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

class NcclCollective {
 public:
  /// Device bytes fiar allocates per rank for calls of up to max_bytes: the buffer for sums the caller does not take
  /// in place (NCCL's own buffers come on top; see NCCL_BUFFSIZE).
  static std::size_t required_bytes(int /*world_size*/, std::size_t max_bytes) { return max_bytes; }
  /// Why the collective cannot exist in this build ("" when it can), `what` naming what needs it.
  static std::string creation_error(std::string_view what) {
    return built_with_nccl ? std::string() : built_without_nccl_text(std::string(what));
  }
  static std::string adopt_error(NcclComm comm, const Topology& topo) {
    if (comm != nullptr) return "";
    return "fiar: the nccl workspace on rank " + std::to_string(topo.rank) +
           " was asked to adopt a null ncclComm_t. Fix: pass an initialized communicator of this group, or use the "
           "constructor without a communicator, which creates one.";
  }

  /// Collective: creates the communicator over `boot` (adopted: checks `adopted` instead), sized for calls of up to
  /// max_bytes, with a symmetric window for calls up to symmetric_max_bytes where every rank can register one.
  template <Bootstrap B>
  NcclCollective(CudaPlatform& platform, B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                 std::size_t max_bytes, std::size_t symmetric_max_bytes, NcclComm adopted = nullptr, bool adopt = false)
      : device_(platform.device()),
        rank_(topo.rank),
        world_(topo.world_size),
        timeout_(cfg.timeout),
        max_bytes_(max_bytes),
        symmetric_max_bytes_(symmetric_max_bytes) {
    create(platform, boot, adopted, adopt);
  }

  [[nodiscard]] NcclComm comm() const { return comm_.get(); }
  [[nodiscard]] bool owns_comm() const { return comm_.owned(); }
  /// Whether the calls run on NCCL's symmetric kernels: the reduction goes through a buffer registered as a symmetric
  /// window on every rank (NCCL 2.27+, an owned communicator, FIAR_NCCL_SYMMETRIC not 0).
  [[nodiscard]] bool symmetric() const { return symmetric_; }
  /// Why the calls take classic ncclAllReduce ("" when symmetric()).
  [[nodiscard]] const std::string& classic_reason() const { return classic_reason_; }

  // While the stream is captured into a graph nothing runs: no event is queried or recorded then.
  void begin_call(cudaStream_t stream) {
    capturing_ = is_capturing(stream);
    check_state(!capturing_);
  }

  /// Where a call of `count` elements whose input a kernel writes first (the MoE finalize) should put it: the
  /// symmetric window when the call takes it, else `out`, else the sum buffer (the all-reduce then runs in place).
  template <ReduceType T>
  T* staging(T* out, [[maybe_unused]] std::size_t count) const {
#if FIAR_HAS_NCCL
    if (symmetric_ && count * sizeof(T) <= symmetric_max_bytes_) return static_cast<T*>(window_.get());
#endif
    return out != nullptr ? out : reinterpret_cast<T*>(scratch_.get());
  }

  /// Enqueues the sum of `count` elements of `in` over the ranks on `stream`, into `out` (null: the collective's own
  /// buffer); returns where the sum will be. Symmetric (up to symmetric_max_bytes): the input is copied into the
  /// registered window, reduced there in place by NCCL's symmetric kernel, and read from there (copied into `out`
  /// when given). Classic (no window, or a larger call, where the copies cost more than the symmetric kernels save):
  /// NCCL reads `in` and writes the result (in place when `in` is where the sum goes: staging()).
  template <ReduceType T>
  const T* allreduce(const T* in, T* out, int /*num_tokens*/, std::size_t count, std::uint32_t /*code*/,
                     const char* epilogue, cudaStream_t stream) {
#if FIAR_HAS_NCCL
    const std::size_t bytes = count * sizeof(T);
    T* window = symmetric_ && bytes <= symmetric_max_bytes_ ? static_cast<T*>(window_.get()) : nullptr;
    T* sum = window != nullptr ? window : out != nullptr ? out : reinterpret_cast<T*>(scratch_.get());
    DeviceGuard guard(device_);
    if (window != nullptr && in != window) {
      cuda_check(cudaMemcpyAsync(window, in, bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (the input into the nccl workspace's symmetric window)",
                 [&] { return "in and the stream belong to device " + std::to_string(device_); });
    }
    const ncclResult_t r =
        ncclAllReduce(window != nullptr ? window : in, sum, count, nccl_type<T>(), ncclSum, comm_.get(), stream);
    if (r != ncclSuccess) {  // the call's text only now: no string on the success path
      enqueued(r, "ncclAllReduce(" + std::to_string(count) + " x " + std::string(dtype_name<T>()) + ", " + epilogue +
                      (window != nullptr ? ", symmetric window" : "") + ") on rank " + std::to_string(rank_));
    }
    if (window != nullptr && out != nullptr) {
      cuda_check(cudaMemcpyAsync(out, window, bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (the sum out of the nccl workspace's symmetric window)",
                 [&] { return "out belongs to device " + std::to_string(device_); });
      return out;
    }
    return sum;
#else
    (void)in;
    (void)out;
    (void)count;
    (void)epilogue;
    (void)stream;
    throw std::logic_error("fiar: unreachable: an NCCL collective cannot exist in a build without NCCL");
#endif
  }

  /// After the call's last operation is enqueued: times it (unless the stream is captured).
  void end_call(cudaStream_t stream) {
#if FIAR_HAS_NCCL
    if (!capturing_) watch(stream);
#else
    (void)stream;
#endif
    ++calls_;
  }

  /// Throws fiar::cuda_error when the communicator reports an asynchronous error, and fiar::timeout_error when a
  /// call has not finished cfg.timeout after it was enqueued (an owned communicator is then aborted, which ends
  /// NCCL's waiting kernels). After either, every later call throws the same: recreate the workspace on every rank.
  /// Calls made while the stream is being captured into a CUDA graph are not timed.
  void check() const { check_state(true); }
  /// Throws the failure a call recorded, if any, without asking NCCL or the device (the Lamport path's check before
  /// every launch, so that a workspace whose route failed launches nothing).
  void check_recorded() const {
    if (!scratch_) throw std::logic_error(moved_from_text("workspace"));
    if (failure_.failed()) raise(failure_, failure_.message());
  }

  /// The workspace failed elsewhere (its Lamport engine): an owned communicator is aborted now, so that a call still
  /// waiting for a rank that never joins it ends; an adopted one is the caller's to abort. The workspace's own error
  /// is what every later call throws.
  void abandon() const {
    pending_ = false;
    comm_.abort();
  }

  /// Test hook: calls numbered from `call` on (names in errors only here).
  void set_call_counter(std::uint32_t call) { calls_ = call; }

 private:
  // check(); `timed` false skips the timing of the pending call (while the caller's stream is captured).
  void check_state(bool timed) const {
    if (!scratch_) throw std::logic_error(moved_from_text("workspace"));
    if (failure_.failed()) raise(failure_, failure_.message());
#if FIAR_HAS_NCCL
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_.get(), &state);
    if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t bad = q != ncclSuccess ? q : state;
      fail(StepOutcome::kCuda, static_cast<int>(bad),
           nccl_failure_text(
               "the nccl workspace's communicator on rank " + std::to_string(rank_) + " (ncclCommGetAsyncError)", bad,
               "the network and every peer rank are healthy (NCCL_DEBUG=WARN shows NCCL's own report); "
               "the workspace is unusable now, so recreate it on every rank",
               comm_.get()));
    }
    if (!pending_ || !timed) return;
    const cudaError_t e = cudaEventQuery(done_.get());
    if (e == cudaSuccess) {
      pending_ = false;
      return;
    }
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      fail(StepOutcome::kCuda, static_cast<int>(e),
           cuda_failure_text("cudaEventQuery (the nccl workspace's call " + std::to_string(pending_call_) +
                                 " on rank " + std::to_string(rank_) + ")",
                             e, "the device is healthy; a kernel on the stream may have faulted"));
    }
    if (std::chrono::steady_clock::now() - pending_since_ > timeout_) {
      const bool owned = comm_.owned();
      comm_.abort();
      fail(StepOutcome::kTimeout, 0,
           "fiar: nccl all-reduce on rank " + std::to_string(rank_) + " has not finished " +
               std::to_string(timeout_.count()) + " ms after call " + std::to_string(pending_call_) +
               " was enqueued: a rank crashed, hung, or launched a different sequence of collectives (NCCL cannot tell "
               "which rank). " +
               (owned ? "The communicator was aborted (ncclCommAbort). "
                      : "The communicator is the caller's: abort it (ncclCommAbort) to release the waiting kernels. ") +
               "Fix: find that rank's failure; the workspace is unusable now, so recreate it on every rank.");
    }
#else
    (void)timed;
#endif
  }

  // Whether `stream` is being captured into a CUDA graph (true also when CUDA cannot tell, e.g. the legacy stream
  // while another stream is captured in global mode: then nothing is timed either).
  static bool is_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;
    }
    return capture != cudaStreamCaptureStatusNone;
  }

  // Collective: the device side of the workspace and the communicator (created, or the adopted one checked), each
  // step agreed by every rank.
  template <Bootstrap B>
  void create(CudaPlatform& platform, B& boot, NcclComm adopted, bool adopt) {
#if FIAR_HAS_NCCL
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    // Step 1: the GPU, the sum buffer, the timing event; the adopted communicator checked, or rank 0's unique id for
    // a new one.
    std::array<char, 128> unique_id{};
    static_assert(sizeof(ncclUniqueId) <= sizeof(unique_id));
    const auto ids = agree(
        boot, attempt([&] {
          platform.synchronize();  // raises the platform's own setup failure (no GPU, bad options)
          scratch_ =
              Borrowed(static_cast<std::byte*>(platform.allocate_local(max_bytes_, "the nccl workspace's sum buffer")));
          DeviceGuard guard(device_);
          done_ = make_event(device_, "nccl workspace");
          if (adopt) {
            check_adopted(adopted, deadline);
            comm_ = NcclCommHandle(adopted, false, timeout_);
          } else if (rank_ == 0) {
            ncclUniqueId id;
            nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId on rank 0",
                       "this host has a usable network interface for NCCL's bootstrap "
                       "(NCCL_SOCKET_IFNAME); NCCL_DEBUG=INFO shows NCCL's view");
            std::memcpy(unique_id.data(), &id, sizeof(id));
          }
        }),
        unique_id, "setting up the nccl workspace");
    if (adopt) return;
    // Step 2: every rank initializes its communicator, non-blocking, bounded by the timeout.
    const StepOutcome init = attempt([&] {
      ncclUniqueId id;
      std::memcpy(&id, ids[0].data(), sizeof(id));
      DeviceGuard guard(device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      NcclComm comm = nullptr;
      const std::string call = "ncclCommInitRankConfig(" + std::to_string(world_) + " ranks, rank " +
                               std::to_string(rank_) + ", device " + std::to_string(device_) + ")";
      const char* hint =
          "every rank of the group creates the workspace at the same time, each on its own GPU (NCCL cannot put two "
          "ranks of one communicator on one GPU), and the ranks can reach each other (NCCL_DEBUG=INFO)";
      const ncclResult_t r = ncclCommInitRankConfig(&comm, world_, id, rank_, &config);
      if (comm != nullptr) comm_ = NcclCommHandle(comm, true, timeout_);
      nccl_check(r, call, hint, comm);
      const ncclResult_t ready = comm != nullptr ? nccl_wait(comm, deadline) : ncclInternalError;
      if (ready == ncclInProgress) {
        comm_.abort();
        throw timeout_error("fiar: " + call + " did not finish within " + std::to_string(timeout_.count()) +
                            " ms; the communicator was aborted. Check: " + hint + ".");
      }
      nccl_check(ready, call + " (reported by ncclCommGetAsyncError)", hint, comm);
    });
    try {
      agree(boot, init, "creating the nccl communicator");
    } catch (...) {
      comm_.abort();  // a peer has no communicator: finalizing ours could only wait for it
      throw;
    }
    register_window(boot, deadline);
#else
    (void)platform;
    (void)boot;
    (void)adopted;
    (void)adopt;
    throw std::logic_error("fiar: unreachable: creation agreed on an NCCL collective in a build without NCCL");
#endif
  }

#if FIAR_HAS_NCCL
  // Step 3 (an owned communicator): a buffer from ncclMemAlloc registered as a symmetric window, so that ncclAllReduce
  // takes NCCL's symmetric kernels. Registration is collective: the ranks first agree that every one of them wants it
  // (NCCL 2.27+ at run time, FIAR_NCCL_SYMMETRIC not 0), then register; a failure on every rank alike (NCCL does not
  // support it here) keeps the classic path, a failure on some ranks only fails the creation on every rank.
  template <Bootstrap B>
  void register_window(B& boot, std::chrono::steady_clock::time_point deadline) {
    const int version = nccl_runtime_version();
    const char* env = std::getenv("FIAR_NCCL_SYMMETRIC");
    const bool disabled = env != nullptr && std::string_view(env) == "0";
    std::int32_t want = 0;
    if (!built_with_nccl_symmetric) {
      classic_reason_ = "fiar was built against an NCCL older than 2.27 (no symmetric windows in its nccl.h)";
    } else if (version < kNcclSymmetricVersion) {
      classic_reason_ = "the NCCL loaded at run time is " + std::to_string(version) + ", older than 2.27";
    } else if (disabled) {
      classic_reason_ = "FIAR_NCCL_SYMMETRIC=0";
    } else if (symmetric_max_bytes_ == 0) {
      classic_reason_ = "nccl_symmetric_max_bytes is 0";
    } else {
      want = 1;
    }
    const auto wants = agree(boot, {}, want, "setting up the nccl workspace's symmetric window");
    for (std::size_t r = 0; r < wants.size(); ++r) {
      if (wants[r] == 0 && want == 1) {
        want = 0;
        classic_reason_ =
            "rank " + std::to_string(r) + " cannot use symmetric windows (its NCCL or FIAR_NCCL_SYMMETRIC)";
      }
    }
    if (want == 0) return log_path();
#if FIAR_NCCL_HAS_WINDOWS
    const StepOutcome registered = attempt([&] {
      DeviceGuard guard(device_);
      const std::size_t align = NCCL_WIN_REQUIRED_ALIGNMENT;
      // Only as large as the largest call that takes it (larger ones run in place on the caller's buffers).
      const std::size_t used = std::min(max_bytes_, symmetric_max_bytes_);
      const std::size_t bytes = (used + align - 1) / align * align;
      void* p = nullptr;
      nccl_check(ncclMemAlloc(&p, bytes), "ncclMemAlloc(" + std::to_string(bytes) + " bytes) for the symmetric window",
                 "free GPU memory (nvidia-smi)");
      window_ = NcclMemory(p, bytes);
      ncclWindow_t handle = nullptr;
      const std::string call = "ncclCommWindowRegister(" + std::to_string(bytes) + " bytes, NCCL_WIN_COLL_SYMMETRIC)";
      const char* hint = "every rank creates the workspace at the same time (the registration is collective)";
      nccl_check(ncclCommWindowRegister(comm_.get(), p, bytes, &handle, NCCL_WIN_COLL_SYMMETRIC), call, hint,
                 comm_.get());
      const ncclResult_t ready = nccl_wait(comm_.get(), deadline);
      if (ready == ncclInProgress) {
        throw timeout_error("fiar: " + call + " did not finish within " + std::to_string(timeout_.count()) +
                            " ms. Check: " + hint + ".");
      }
      nccl_check(ready, call + " (reported by ncclCommGetAsyncError)", hint, comm_.get());
    });
    const auto outcomes = all_gather_value(boot, Envelope<NoValue>{registered, {}});
    const bool all_failed =
        std::all_of(outcomes.begin(), outcomes.end(), [](const Envelope<NoValue>& o) { return o.outcome.failed(); });
    if (all_failed) {
      // NCCL refused the same way everywhere (e.g. a topology its symmetric kernels do not cover): stay classic.
      window_ = NcclMemory();
      classic_reason_ =
          "NCCL did not register the symmetric window on any rank: " + without_fiar_prefix(registered.message());
      return log_path();
    }
    try {
      raise_first_failure(outcomes, boot.rank(), "registering the nccl workspace's symmetric window on rank {rank}");
    } catch (...) {
      comm_.abort();  // some ranks registered, some did not: the communicator cannot be trusted
      throw;
    }
    symmetric_ = true;
    classic_reason_.clear();
    log_path();
#else
    (void)deadline;
#endif
  }

  // One info line for the group (rank 0): which ncclAllReduce the calls take.
  void log_path() const {
    if (rank_ != 0 || !log_enabled(LogLevel::Info)) return;
    const int v = nccl_runtime_version();
    const std::string version =
        std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    log(LogLevel::Info,
        "nccl workspace: NCCL " + version + ", " +
            (symmetric_
                 ? "symmetric window registered: ncclAllReduce runs NCCL's symmetric kernels for calls up to " +
                       std::to_string(symmetric_max_bytes_) + " bytes per rank, in place on the caller's buffers beyond"
                 : "classic ncclAllReduce (" + classic_reason_ + ")"));
  }

  // An adopted communicator must describe this very group on this very GPU.
  void check_adopted(NcclComm comm, std::chrono::steady_clock::time_point deadline) const {
    const char* valid = "the communicator is valid and initialized";
    const ncclResult_t ready = nccl_wait(comm, deadline);
    if (ready == ncclInProgress) {
      throw timeout_error("fiar: the NCCL communicator given to the nccl workspace on rank " + std::to_string(rank_) +
                          " was still initializing after " + std::to_string(timeout_.count()) +
                          " ms. Check: every rank called ncclCommInitRank(Config) with the same unique id.");
    }
    nccl_check(ready, "ncclCommGetAsyncError (the adopted communicator)", valid, comm);
    int count = 0, rank = -1, device = -1;
    nccl_check(ncclCommCount(comm, &count), "ncclCommCount (the adopted communicator)", valid, comm);
    nccl_check(ncclCommUserRank(comm, &rank), "ncclCommUserRank (the adopted communicator)", valid, comm);
    nccl_check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice (the adopted communicator)", valid, comm);
    if (count != world_ || rank != rank_) {
      throw std::invalid_argument(
          "fiar: the NCCL communicator given to the nccl workspace on rank " + std::to_string(rank_) + " has " +
          std::to_string(count) + " ranks and puts this process at rank " + std::to_string(rank) +
          ", but the topology says world_size " + std::to_string(world_) + ", rank " + std::to_string(rank_) +
          ". Fix: pass the communicator of this tensor-parallel group (e.g. from ncclCommSplit), with ranks numbered "
          "like the bootstrap's.");
    }
    if (device != device_) {
      throw std::invalid_argument("fiar: the NCCL communicator given to the nccl workspace on rank " +
                                  std::to_string(rank_) + " runs on CUDA device " + std::to_string(device) +
                                  ", but the workspace was created with device " + std::to_string(device_) +
                                  " current. Fix: cudaSetDevice(" + std::to_string(device) +
                                  ") before creating the workspace.");
    }
  }

  // A collective that ncclAllReduce did not enqueue at once: wait (bounded) for a non-blocking communicator to finish
  // enqueueing, so that the epilogue kernel follows it on the stream; fail on an error.
  void enqueued(ncclResult_t r, const std::string& call) {
    const char* hint =
        "every rank calls the same collectives with the same num_tokens, and in, out and the stream "
        "belong to this rank's device";
    if (r == ncclInProgress) {
      r = nccl_wait(comm_.get(), std::chrono::steady_clock::now() + timeout_);
      if (r == ncclInProgress) {
        const bool owned = comm_.owned();
        comm_.abort();
        fail(StepOutcome::kTimeout, 0,
             "fiar: " + call + " was still being enqueued after " + std::to_string(timeout_.count()) +
                 " ms (ncclInProgress)" + (owned ? "; the communicator was aborted" : "") +
                 ". Fix: find the rank that did not make this call; recreate the workspace on every rank.");
      }
    }
    if (r != ncclSuccess) fail(StepOutcome::kCuda, static_cast<int>(r), nccl_failure_text(call, r, hint, comm_.get()));
  }

  // Times the call just enqueued (not captured), unless an earlier one is still being timed: so a hang is noticed
  // even while later calls keep coming.
  void watch(cudaStream_t stream) {
    if (pending_) return;
    cuda_check(cudaEventRecord(done_.get(), stream), "cudaEventRecord (timing the nccl workspace's call)",
               [&] { return "the stream belongs to device " + std::to_string(device_); });
    pending_ = true;
    pending_since_ = std::chrono::steady_clock::now();
    pending_call_ = calls_;
  }
#endif

  // Records a failure that makes the workspace unusable, and throws it.
  [[noreturn]] void fail(StepOutcome::Kind kind, int status, const std::string& what) const {
    failure_.record(kind, status, what);
    raise(failure_, what);
  }

  int device_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::size_t max_bytes_;            ///< the largest call's bytes (the sum buffer's size)
  std::size_t symmetric_max_bytes_;  ///< calls up to this many bytes take the symmetric window
  NcclMemory window_;  ///< the symmetric window's memory: declared before comm_, freed after it is destroyed
  bool symmetric_ = false;
  std::string classic_reason_ = "an adopted communicator (register your own windows on it)";
  mutable NcclCommHandle comm_;  ///< destroyed before the window and before the platform's memory
  EventHandle done_;             ///< recorded after a timed call
  Borrowed<std::byte> scratch_;  ///< sums the caller does not take in place (device memory the platform owns); null
                                 ///< once moved from
  std::uint64_t calls_ = 0;
  bool capturing_ = false;  ///< the current call's stream is being captured
  mutable bool pending_ = false;
  mutable std::chrono::steady_clock::time_point pending_since_{};
  mutable std::uint64_t pending_call_ = 0;
  mutable StepOutcome failure_;
};
}  // namespace detail
FIAR_END_NAMESPACE
