// fiar/nccl.hpp — Workspace<NcclPolicy, T, Platform>: the fallback that works on any topology. The sum is a
// library all-reduce (ncclAllReduce on CudaPlatform; a plain host reduction among the emulated ranks on
// HostPlatform); the fused epilogue is then a pass of its own (algo/epilogue_pass.hpp).
// Contract: the public interface of the trtllm and mnnvl workspaces (collective verified creation, calls
// validated before anything runs, bounded waits, move-only); NCCL is optional at build time (FIAR_HAS_NCCL).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "algo/epilogue.hpp"
#include "algo/epilogue_pass.hpp"
#include "algo/host_emulator.hpp"
#include "algo/memory.hpp"
#include "bootstrap.hpp"
#include "detail/convert.hpp"
#include "detail/cuda_check.hpp"
#include "detail/lamport_workspace.hpp"
#include "detail/nccl_support.hpp"
#include "detail/validate.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "nccl_bootstrap.hpp"
#include "platform_cuda.hpp"
#include "platform_host.hpp"
#include "policy.hpp"
#include "resolve.hpp"
#include "topology.hpp"
#include "version.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

namespace cuda_detail {
/// Launches algo::epilogue_pass<P, T> on `stream`, with CudaPlatform's launch shape and PDL setting (defined
/// in <fiar/cuda/epilogue_kernel.cuh>: a program that runs fused patterns on the nccl backend compiles one
/// nvcc translation unit that includes <fiar/fiar.cuh>). Hidden and never inlined, like CudaPlatform::launch.
template <Pattern P, ReduceType T>
[[gnu::visibility("hidden"), gnu::noinline]] void launch_epilogue_pass(const CudaPlatform& platform,
                                                                       const algo::EpiloguePassParams<T>& p,
                                                                       cudaStream_t stream);
}  // namespace cuda_detail

namespace detail {

/// What the nccl workspaces of both platforms share: sizing, validation, creation agreement, and the
/// accessors and allreduce() of the common workspace interface.
template <ReduceType T, class Platform>
class NcclWorkspaceBase {
 public:
  using policy_type = NcclPolicy;
  using value_type = T;
  using platform_type = Platform;

  /// "" when the nccl backend can serve the configuration on the topology, else why not.
  static std::string why_not(const Topology& topo, const WorkspaceConfig& cfg) {
    return why_not_text<NcclPolicy>(topo, [&] { return config_error(cfg); });
  }
  static bool can_implement(const Topology& topo, const WorkspaceConfig& cfg) {
    return implementable(topo, [&] { return why_not(topo, cfg); });
  }

  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Platform& platform() { return platform_; }
  /// The architecture the epilogue runs on: the GPU's on CudaPlatform, the topology's on the host emulator.
  [[nodiscard]] int arch() const { return platform_.arch() != 0 ? platform_.arch() : topo_.arch; }

  /// Always Strategy::Auto: the nccl backend has no one-shot / two-shot choice of its own (NCCL picks its
  /// algorithm, ring, tree or NVLS, inside ncclAllReduce). An explicit strategy is rejected by every call.
  [[nodiscard]] Strategy strategy_for(int) const { return Strategy::Auto; }

  /// Whether a call of num_tokens tokens with strategy s would be accepted: 1 <= num_tokens <= max_token_num
  /// and s == Strategy::Auto.
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    return num_tokens >= 1 && num_tokens <= cfg_.max_token_num && s == Strategy::Auto;
  }

  /// The strategy the last call ran: Strategy::Auto (NCCL's own choice) once a call ran.
  [[nodiscard]] Strategy last_strategy() const { return last_strategy_; }

  /// Sums `in` over all ranks into `out` ([num_tokens, hidden_dim] each; out may equal in), on `stream`
  /// (CudaPlatform). Collective: every rank calls it with the same num_tokens, in the same order as every other
  /// collective of the group (on CudaPlatform: of the communicator).
  void allreduce(const T* in, T* out, int num_tokens, cudaStream_t stream = nullptr,
                 Strategy strategy = Strategy::Auto) {
    FusedArgs<T> a;
    a.in = in;
    a.out = out;
    a.num_tokens = num_tokens;
    // Both platforms' workspaces derive from this base, and only from it.
    static_cast<Workspace<NcclPolicy, T, Platform>&>(*this).template run<Pattern::AllReduce>(a, stream, strategy);
  }

 protected:
  NcclWorkspaceBase(const typename Platform::Options& options, const Topology& topo, const WorkspaceConfig& cfg)
      : platform_(options), topo_(topo), cfg_(cfg) {}
  NcclWorkspaceBase(NcclWorkspaceBase&&) noexcept = default;
  NcclWorkspaceBase& operator=(NcclWorkspaceBase&&) noexcept = default;
  ~NcclWorkspaceBase() = default;

  static int vecs_per_token(int hidden_dim) {
    return static_cast<int>(static_cast<std::size_t>(hidden_dim) * sizeof(T) / 16);
  }
  /// Bytes of one [max_token_num, hidden_dim] tensor of T.
  static std::size_t activation_bytes(const WorkspaceConfig& cfg) {
    return static_cast<std::size_t>(cfg.max_token_num) * static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
  }

  // No Lamport buffer to bound (unlike trtllm / mnnvl): the checks every backend runs are all nccl needs.
  static std::string config_error(const WorkspaceConfig& cfg) { return common_config_error<T>(cfg); }

  // This rank's objection to the creation ("" when none): the topology, its match with the bootstrap, the
  // configuration.
  template <Bootstrap B>
  std::string local_error(B& boot) const {
    return local_creation_error<NcclPolicy>(topo_, boot, [&] { return config_error(cfg_); });
  }

  // Collective: every rank returns, or every rank throws the same std::invalid_argument (a rank's objection,
  // or configurations that differ).
  template <Bootstrap B>
  void agree(B& boot, const std::string& error, std::uint64_t words) {
    CreationRecord mine = creation_record<T>(Backend::Nccl, topo_, cfg_);
    // The one-shot settings do not apply to nccl: left out of the digest, so they cannot cause a mismatch.
    mine.oneshot_at_max_tokens = 0;
    mine.oneshot_max_bytes = 0;
    mine.buffer_words = error.empty() ? words : 0;
    agree_on_creation(boot, mine, error);
  }

  // The call-level checks before the pattern's own (validate_fused): null in / out, token count, strategy.
  void validate_call(const FusedArgs<T>& a, Strategy strategy, Pattern pattern) const {
    const std::string where = call_where(pattern, topo_.rank);
    validate_call_basics(where, pattern, a.in, a.out, a.num_tokens, cfg_.max_token_num);
    if (strategy != Strategy::Auto) {
      throw std::invalid_argument(where + "strategy " + std::string(to_string(strategy)) +
                                  "; the nccl backend has no one-shot / two-shot choice (NCCL picks its own "
                                  "algorithm). Fix: pass Strategy::Auto.");
    }
  }

  std::string timeout_text(const std::string& waited, std::uint64_t call) const {
    return "fiar: nccl all-reduce on rank " + std::to_string(topo_.rank) + " gave up after " +
           std::to_string(cfg_.timeout.count()) + " ms " + waited + " (call " + std::to_string(call) +
           "): a rank crashed, hung, or launched a different sequence of collectives. Fix: find that rank's "
           "failure; the workspace is unusable now, so recreate it on every rank.";
  }

  Platform platform_;
  Topology topo_;
  WorkspaceConfig cfg_;
  Strategy last_strategy_ = Strategy::Auto;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// HostPlatform: the emulated ranks reduce through a shared host region, then the epilogue runs on the grid.
// ---------------------------------------------------------------------------------------------------------

/// The nccl backend on the host emulator. No NCCL is involved: each call copies this rank's input into its
/// block of a region every rank sees, waits (bounded) until every rank has done so, sums all blocks in rank
/// order in fp32 (identical bits on every rank, the same numerics as the trtllm backend), waits until every
/// rank has read, then runs the fused epilogue on the emulated grid. Calls are synchronous.
template <ReduceType T>
class Workspace<NcclPolicy, T, HostPlatform> : public detail::NcclWorkspaceBase<T, HostPlatform> {
  using Base = detail::NcclWorkspaceBase<T, HostPlatform>;

 public:
  /// Bytes each rank allocates: its block of the shared region (arrival words + one [max_token_num,
  /// hidden_dim] input) and the local sum buffer of the fused patterns.
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return block_bytes(topo.world_size, cfg) + Base::activation_bytes(cfg);
  }

  /// Collective: every rank constructs its workspace with the same topology (bar rank) and configuration.
  /// Throws std::invalid_argument on every rank alike when they cannot work, before allocating anything.
  template <Bootstrap B>
  Workspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg, const HostPlatformOptions& options = {})
      : Base(options, topo, cfg) {
    const std::string error = this->local_error(boot);
    this->agree(boot, error, error.empty() ? block_bytes(topo.world_size, cfg) / 4 : 0);
    // Zero-filled, and handed out with a barrier: every arrival word starts at 0 on every rank.
    blocks_ = this->platform_.allocate_shared(boot, block_bytes(topo.world_size, cfg));
    sum_ = static_cast<T*>(this->platform_.allocate_local(Base::activation_bytes(cfg)));
    valid_ = true;
  }

  Workspace(Workspace&& other) noexcept
      : Base(std::move(other)),
        blocks_(std::move(other.blocks_)),
        sum_(std::exchange(other.sum_, nullptr)),
        calls_(other.calls_),
        failure_(std::move(other.failure_)),
        valid_(std::exchange(other.valid_, false)) {}
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      Base::operator=(std::move(other));
      blocks_ = std::move(other.blocks_);
      sum_ = std::exchange(other.sum_, nullptr);
      calls_ = other.calls_;
      failure_ = std::move(other.failure_);
      valid_ = std::exchange(other.valid_, false);
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() = default;

  /// All-reduce fused with the pattern's epilogue. Collective; `a` is checked before anything runs.
  template <Pattern P>
  void run(const FusedArgs<T>& a, cudaStream_t = nullptr, Strategy strategy = Strategy::Auto) {
    check();
    this->validate_call(a, strategy, P);
    detail::validate_fused<P, T>(a, this->cfg_.hidden_dim, this->arch(), this->topo_.rank, this->platform_);
    const auto deadline = std::chrono::steady_clock::now() + this->cfg_.timeout;
    const std::uint64_t call = calls_++;
    const std::size_t count = static_cast<std::size_t>(a.num_tokens) * static_cast<std::size_t>(this->cfg_.hidden_dim);
    // Sequence numbers of this call's two arrivals: consecutive calls' barriers cannot be confused.
    const auto arrival = static_cast<std::uint32_t>(2 * call + 1);

    std::memcpy(data_of(this->topo_.rank), a.in, count * sizeof(T));
    if (!arrive_and_wait(arrival, deadline, call, "waiting for the input of rank(s) ")) check();
    T* sum = P == Pattern::AllReduce ? a.out : sum_;
    reduce(sum, count);
    // Nobody overwrites its block (next call) before every rank has read it.
    if (!arrive_and_wait(arrival + 1, deadline, call, "waiting for rank(s) ")) check();

    if constexpr (P != Pattern::AllReduce) {
      const algo::EpiloguePassParams<T> p{sum, nullptr, a.num_tokens, Base::vecs_per_token(this->cfg_.hidden_dim),
                                          detail::epilogue_params(a)};
      this->platform_.run_grid([&p](algo::HostCtx& ctx) { algo::epilogue_pass<P, T>(ctx, p); });
    }
    this->last_strategy_ = Strategy::Auto;
  }

  /// Throws fiar::timeout_error if a call of this workspace gave up waiting for a rank (then every later call
  /// throws the same: recreate the workspace on every rank).
  void check() const {
    if (!valid_) throw std::logic_error("fiar: this workspace was moved from. Fix: call the workspace it was moved to.");
    if (!failure_.empty()) throw timeout_error(failure_);
  }

 private:
  // Rank 0's block starts with one arrival word per rank; every block then holds one [max_token_num,
  // hidden_dim] input, 64-byte aligned.
  static std::size_t header_bytes(int world_size) {
    return (static_cast<std::size_t>(world_size) * sizeof(std::uint32_t) + 63) / 64 * 64;
  }
  static std::size_t block_bytes(int world_size, const WorkspaceConfig& cfg) {
    return header_bytes(world_size) + Base::activation_bytes(cfg);
  }
  T* data_of(int rank) const {
    return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(blocks_[static_cast<std::size_t>(rank)]) +
                                header_bytes(this->topo_.world_size));
  }

  // Publishes this rank's arrival `target` and waits until every rank's word has reached it, or the deadline
  // passes (then records which ranks are missing and returns false).
  bool arrive_and_wait(std::uint32_t target, std::chrono::steady_clock::time_point deadline, std::uint64_t call,
                       const char* waited) {
    std::uint32_t* words = blocks_[0];
    const int world = this->topo_.world_size;
    algo::SystemAtomics::store_release(words + this->topo_.rank, target);
    auto behind = [&](int r) {
      return static_cast<std::int32_t>(algo::SystemAtomics::load_acquire(words + r) - target) < 0;
    };
    for (int r = 0; r < world; ++r) {
      for (int spin = 0; behind(r); ++spin) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::string missing;
          for (int m = 0; m < world; ++m) {
            if (behind(m)) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
          }
          failure_ = this->timeout_text(waited + missing, call);
          return false;
        }
        if (spin < 256) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
    return true;
  }

  // The sum of every rank's block in rank order, in fp32 from +0, rounded to T; a -0 result is written +0
  // (fiar's documented numerics, bit-identical to the trtllm backend's).
  void reduce(T* out, std::size_t count) const {
    const int world = this->topo_.world_size;
    std::vector<const T*> in(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) in[static_cast<std::size_t>(r)] = data_of(r);
    for (std::size_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < world; ++r) acc += detail::to_float(in[static_cast<std::size_t>(r)][i]);
      T v = detail::from_float<T>(acc);
      if (detail::to_float(v) == 0.0f) v = detail::from_float<T>(0.0f);
      out[i] = v;
    }
  }

  std::vector<std::uint32_t*> blocks_;
  T* sum_ = nullptr;  ///< [max_token_num, hidden_dim]: the reduced sum of a fused call
  std::uint64_t calls_ = 0;
  std::string failure_;
  bool valid_ = false;
};

// ---------------------------------------------------------------------------------------------------------
// CudaPlatform: ncclAllReduce on the caller's stream, then the epilogue kernel.
// ---------------------------------------------------------------------------------------------------------

namespace detail {

/// An NCCL communicator, owned (destroyed or aborted here) or adopted (left alone). Never throws on teardown.
class NcclCommHandle {
 public:
  NcclCommHandle() = default;
  NcclCommHandle(NcclComm comm, bool owned, std::chrono::milliseconds timeout) noexcept
      : comm_(comm), owned_(owned), timeout_(timeout) {}
  NcclCommHandle(NcclCommHandle&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)), owned_(other.owned_), timeout_(other.timeout_) {}
  NcclCommHandle& operator=(NcclCommHandle&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, nullptr);
      owned_ = other.owned_;
      timeout_ = other.timeout_;
    }
    return *this;
  }
  NcclCommHandle(const NcclCommHandle&) = delete;
  NcclCommHandle& operator=(const NcclCommHandle&) = delete;
  ~NcclCommHandle() { reset(); }

  [[nodiscard]] NcclComm get() const noexcept { return comm_; }
  [[nodiscard]] bool owned() const noexcept { return owned_; }

  /// Aborts an owned communicator now (NCCL's kernels waiting for a peer return); forgets an adopted one.
  void abort() noexcept {
#if FIAR_HAS_NCCL
    if (comm_ != nullptr && owned_) (void)ncclCommAbort(comm_);
#endif
    comm_ = nullptr;
  }

  /// Destroys an owned communicator: finalize (waiting at most the timeout for its operations), then
  /// destroy; abort instead when finalizing fails or does not finish in time.
  void reset() noexcept {
#if FIAR_HAS_NCCL
    if (comm_ != nullptr && owned_) {
      const ncclResult_t r = ncclCommFinalize(comm_);
      const bool finalized =
          (r == ncclSuccess || r == ncclInProgress) &&
          nccl_wait(comm_, std::chrono::steady_clock::now() + timeout_) == ncclSuccess;
      (void)(finalized ? ncclCommDestroy(comm_) : ncclCommAbort(comm_));
    }
#endif
    comm_ = nullptr;
  }

 private:
  NcclComm comm_ = nullptr;
  bool owned_ = false;
  std::chrono::milliseconds timeout_{0};
};

/// A CUDA event that destroys itself.
class CudaEvent {
 public:
  CudaEvent() = default;
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { reset(); }

  void create(int device) {
    DeviceGuard guard(device);
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags (nccl workspace) on device " + std::to_string(device),
               "the device is healthy and not out of resources");
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }
  void reset() noexcept {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = nullptr;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

/// One rank's outcome of a collective creation step, exchanged so that every rank throws alike
/// (detail::capture_failure / detail::rethrow_first_failure).
struct NcclStepRecord {
  std::int32_t kind;    ///< FailureKind of this rank's failure
  std::int32_t status;  ///< the cudaError_t / ncclResult_t of a cuda_error
  std::array<char, 640> error;
  std::array<char, 128> unique_id;  ///< rank 0: the ncclUniqueId of a communicator fiar creates
};

}  // namespace detail

/// The nccl backend on GPUs: ncclAllReduce on the caller's stream (into `out`, or for the fused patterns into
/// a workspace-owned sum buffer), then the fused epilogue as a kernel of its own on the same stream. Works on
/// any topology NCCL supports (several nodes, PCIe-only machines). The communicator is created from the
/// bootstrap (owned), or an existing one is adopted (not owned). Needs a build with NCCL (FIAR_HAS_NCCL);
/// without it the type still compiles, and its constructors throw std::invalid_argument on every rank.
template <ReduceType T>
class Workspace<NcclPolicy, T, CudaPlatform> : public detail::NcclWorkspaceBase<T, CudaPlatform> {
  using Base = detail::NcclWorkspaceBase<T, CudaPlatform>;

 public:
  /// Device bytes fiar allocates per rank: the [max_token_num, hidden_dim] sum buffer of the fused patterns
  /// (NCCL's own buffers come on top; see NCCL_BUFFSIZE).
  static std::size_t required_bytes(const Topology&, const WorkspaceConfig& cfg) { return Base::activation_bytes(cfg); }

  /// Collective: creates an NCCL communicator for the bootstrap's group on the calling thread's current
  /// device (rank 0's unique id travels over the bootstrap; non-blocking initialization bounded by
  /// cfg.timeout). Every rank throws alike: std::invalid_argument for a bad topology or configuration,
  /// fiar::cuda_error for a failed CUDA or NCCL call, fiar::timeout_error when initialization hangs.
  template <Bootstrap B>
  Workspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg, const CudaPlatformOptions& options = {})
      : Base(options, topo, cfg) {
    create(boot, nullptr, false);
  }

  /// Collective: adopts `comm`, an initialized communicator of exactly this group (same size, same rank
  /// numbers as the bootstrap, on the calling thread's current device). It is not owned: destroy it after
  /// this workspace.
  template <Bootstrap B>
  Workspace(B& boot, NcclComm comm, const Topology& topo, const WorkspaceConfig& cfg,
            const CudaPlatformOptions& options = {})
      : Base(options, topo, cfg) {
    create(boot, comm, true);
  }

  Workspace(Workspace&& other) noexcept
      : Base(std::move(other)),
        comm_(std::move(other.comm_)),
        done_(std::move(other.done_)),
        sum_(std::exchange(other.sum_, nullptr)),
        calls_(other.calls_),
        pending_(std::exchange(other.pending_, false)),
        pending_since_(other.pending_since_),
        pending_call_(other.pending_call_),
        failure_(std::move(other.failure_)),
        failure_kind_(other.failure_kind_),
        failure_status_(other.failure_status_),
        valid_(std::exchange(other.valid_, false)) {}
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      comm_ = std::move(other.comm_);  // before the platform: the communicator goes first
      done_ = std::move(other.done_);
      Base::operator=(std::move(other));
      sum_ = std::exchange(other.sum_, nullptr);
      calls_ = other.calls_;
      pending_ = std::exchange(other.pending_, false);
      pending_since_ = other.pending_since_;
      pending_call_ = other.pending_call_;
      failure_ = std::move(other.failure_);
      failure_kind_ = other.failure_kind_;
      failure_status_ = other.failure_status_;
      valid_ = std::exchange(other.valid_, false);
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  /// Destroys an owned communicator (finalize, bounded by cfg.timeout, then destroy; abort when that fails);
  /// never throws. Destroy the workspace on every rank after the last call was issued everywhere.
  ~Workspace() = default;

  /// The communicator the calls run on (owned or adopted; null after a timeout aborted it).
  [[nodiscard]] NcclComm comm() const { return comm_.get(); }
  /// Whether the workspace created (and destroys) its communicator.
  [[nodiscard]] bool owns_comm() const { return comm_.owned(); }

  /// All-reduce fused with the pattern's epilogue, on `stream`. Collective like allreduce(); `a` is checked
  /// before anything is enqueued.
  template <Pattern P>
  void run(const FusedArgs<T>& a, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    // While the stream is captured into a graph nothing runs: no event is queried or recorded then.
    const bool capturing = is_capturing(stream);
    check_state(!capturing);
    this->validate_call(a, strategy, P);
    detail::validate_fused<P, T>(a, this->cfg_.hidden_dim, this->arch(), this->topo_.rank, this->platform_);
#if FIAR_HAS_NCCL
    const std::size_t count = static_cast<std::size_t>(a.num_tokens) * static_cast<std::size_t>(this->cfg_.hidden_dim);
    T* sum = P == Pattern::AllReduce ? a.out : sum_;
    {
      detail::DeviceGuard guard(this->platform_.device());
      const std::string call = "ncclAllReduce(" + std::to_string(count) + " x " + std::string(dtype_name<T>()) +
                               ", " + to_string(P) + ") on rank " + std::to_string(this->topo_.rank);
      const ncclResult_t r =
          ncclAllReduce(a.in, sum, count, detail::nccl_type<T>(), ncclSum, comm_.get(), stream);
      if (r != ncclSuccess) enqueued(r, call);
    }
    if constexpr (P != Pattern::AllReduce) {
      const algo::EpiloguePassParams<T> p{sum, nullptr, a.num_tokens, Base::vecs_per_token(this->cfg_.hidden_dim),
                                          detail::epilogue_params(a)};
      cuda_detail::launch_epilogue_pass<P, T>(this->platform_, p, stream);
    }
    if (!capturing) watch(stream);
    ++calls_;
    this->last_strategy_ = Strategy::Auto;
#else
    (void)stream;
    throw std::logic_error("fiar: unreachable: a nccl workspace cannot exist in a build without NCCL");
#endif
  }

  /// Throws fiar::cuda_error when the communicator reports an asynchronous error, and fiar::timeout_error
  /// when a call has not finished cfg.timeout after it was enqueued (an owned communicator is then aborted,
  /// which ends NCCL's waiting kernels). After either, every later call throws the same: recreate the
  /// workspace on every rank. Calls made while the stream is being captured into a CUDA graph are not timed.
  void check() const { check_state(true); }

 private:
  // check(); `timed` false skips the timing of the pending call (while the caller's stream is captured).
  void check_state(bool timed) const {
    if (!valid_) throw std::logic_error("fiar: this workspace was moved from. Fix: call the workspace it was moved to.");
    rethrow_failure();
#if FIAR_HAS_NCCL
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_.get(), &state);
    if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t bad = q != ncclSuccess ? q : state;
      fail(1, static_cast<int>(bad),
           detail::nccl_failure_text("the nccl workspace's communicator on rank " + std::to_string(this->topo_.rank) +
                                         " (ncclCommGetAsyncError)",
                                     bad,
                                     "the network and every peer rank are healthy (NCCL_DEBUG=WARN shows NCCL's "
                                     "own report); the workspace is unusable now, so recreate it on every rank",
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
      fail(1, static_cast<int>(e),
           detail::cuda_failure_text("cudaEventQuery (the nccl workspace's call " + std::to_string(pending_call_) +
                                         " on rank " + std::to_string(this->topo_.rank) + ")",
                                     e, "the device is healthy; a kernel on the stream may have faulted"));
    }
    if (std::chrono::steady_clock::now() - pending_since_ > this->cfg_.timeout) {
      const bool owned = comm_.owned();
      comm_.abort();
      fail(3, 0,
           "fiar: nccl all-reduce on rank " + std::to_string(this->topo_.rank) + " has not finished " +
               std::to_string(this->cfg_.timeout.count()) + " ms after call " + std::to_string(pending_call_) +
               " was enqueued: a rank crashed, hung, or launched a different sequence of collectives (NCCL cannot "
               "tell which rank). " +
               (owned ? "The communicator was aborted (ncclCommAbort). "
                      : "The communicator is the caller's: abort it (ncclCommAbort) to release the waiting kernels. ") +
               "Fix: find that rank's failure; the workspace is unusable now, so recreate it on every rank.");
    }
#else
    (void)timed;
#endif
  }

  // Whether `stream` is being captured into a CUDA graph (true also when CUDA cannot tell, e.g. the legacy
  // stream while another stream is captured in global mode: then nothing is timed either).
  static bool is_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;
    }
    return capture != cudaStreamCaptureStatusNone;
  }

  template <Bootstrap B>
  void create(B& boot, NcclComm adopted, bool adopt) {
    const std::string dt(dtype_name<T>());
    std::string error = this->local_error(boot);
    if (error.empty() && !built_with_nccl) {
      error = detail::built_without_nccl_text("Workspace<NcclPolicy, " + dt + ", CudaPlatform>");
    }
    if (error.empty() && adopt && adopted == nullptr) {
      error = "fiar: the nccl workspace on rank " + std::to_string(this->topo_.rank) +
              " was asked to adopt a null ncclComm_t. Fix: pass an initialized communicator of this group, or use "
              "the constructor without a communicator, which creates one.";
    }
    this->agree(boot, error, error.empty() ? Base::activation_bytes(this->cfg_) / 4 : 0);
#if FIAR_HAS_NCCL
    const auto deadline = std::chrono::steady_clock::now() + this->cfg_.timeout;
    // Step 1: the GPU, the sum buffer, the timing event; the adopted communicator checked, or rank 0's unique
    // id for a new one.
    detail::NcclStepRecord mine{};
    detail::capture_failure(
        [&] {
          this->platform_.synchronize();  // raises the platform's own setup failure (no GPU, bad options)
          sum_ = static_cast<T*>(this->platform_.allocate_local(Base::activation_bytes(this->cfg_)));
          done_.create(this->platform_.device());
          if (adopt) {
            check_adopted(adopted, deadline);
            comm_ = detail::NcclCommHandle(adopted, false, this->cfg_.timeout);
          } else if (this->topo_.rank == 0) {
            ncclUniqueId id;
            detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId on rank 0",
                               "this host has a usable network interface for NCCL's bootstrap (NCCL_SOCKET_IFNAME); "
                               "NCCL_DEBUG=INFO shows NCCL's view");
            static_assert(sizeof(id) == sizeof(mine.unique_id));
            std::memcpy(mine.unique_id.data(), &id, sizeof(id));
          }
        },
        mine.status, mine.kind, mine.error);
    const auto setup = all_gather_value(boot, mine);
    detail::rethrow_first_failure(setup, this->topo_.rank, "setting up the nccl workspace");
    if (adopt) {
      valid_ = true;
      return;
    }
    // Step 2: every rank initializes its communicator, non-blocking, bounded by the timeout.
    detail::NcclStepRecord init{};
    detail::capture_failure(
        [&] {
          ncclUniqueId id;
          std::memcpy(&id, setup[0].unique_id.data(), sizeof(id));
          detail::DeviceGuard guard(this->platform_.device());
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          config.blocking = 0;
          NcclComm comm = nullptr;
          const std::string call = "ncclCommInitRankConfig(" + std::to_string(this->topo_.world_size) +
                                   " ranks, rank " + std::to_string(this->topo_.rank) + ", device " +
                                   std::to_string(this->platform_.device()) + ")";
          const char* hint =
              "every rank of the group creates the workspace at the same time, each on its own GPU (NCCL cannot put "
              "two ranks of one communicator on one GPU), and the ranks can reach each other (NCCL_DEBUG=INFO)";
          const ncclResult_t r = ncclCommInitRankConfig(&comm, this->topo_.world_size, id, this->topo_.rank, &config);
          if (comm != nullptr) comm_ = detail::NcclCommHandle(comm, true, this->cfg_.timeout);
          detail::nccl_check(r, call, hint, comm);
          const ncclResult_t ready = comm != nullptr ? detail::nccl_wait(comm, deadline) : ncclInternalError;
          if (ready == ncclInProgress) {
            comm_.abort();
            throw timeout_error("fiar: " + call + " did not finish within " +
                                std::to_string(this->cfg_.timeout.count()) +
                                " ms; the communicator was aborted. Check: " + hint + ".");
          }
          detail::nccl_check(ready, call + " (reported by ncclCommGetAsyncError)", hint, comm);
        },
        init.status, init.kind, init.error);
    const auto inits = all_gather_value(boot, init);
    for (const auto& r : inits) {
      if (r.kind != detail::kNoFailure) {
        comm_.abort();  // a peer has no communicator: finalizing ours could only wait for it
        break;
      }
    }
    detail::rethrow_first_failure(inits, this->topo_.rank, "creating the nccl communicator");
#endif
    valid_ = true;
  }

#if FIAR_HAS_NCCL
  // An adopted communicator must describe this very group on this very GPU.
  void check_adopted(NcclComm comm, std::chrono::steady_clock::time_point deadline) const {
    const char* valid = "the communicator is valid and initialized";
    const ncclResult_t ready = detail::nccl_wait(comm, deadline);
    if (ready == ncclInProgress) {
      throw timeout_error("fiar: the NCCL communicator given to the nccl workspace on rank " +
                          std::to_string(this->topo_.rank) + " was still initializing after " +
                          std::to_string(this->cfg_.timeout.count()) +
                          " ms. Check: every rank called ncclCommInitRank(Config) with the same unique id.");
    }
    detail::nccl_check(ready, "ncclCommGetAsyncError (the adopted communicator)", valid, comm);
    int count = 0, rank = -1, device = -1;
    detail::nccl_check(ncclCommCount(comm, &count), "ncclCommCount (the adopted communicator)", valid, comm);
    detail::nccl_check(ncclCommUserRank(comm, &rank), "ncclCommUserRank (the adopted communicator)", valid, comm);
    detail::nccl_check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice (the adopted communicator)", valid, comm);
    if (count != this->topo_.world_size || rank != this->topo_.rank) {
      throw std::invalid_argument(
          "fiar: the NCCL communicator given to the nccl workspace on rank " + std::to_string(this->topo_.rank) +
          " has " + std::to_string(count) + " ranks and puts this process at rank " + std::to_string(rank) +
          ", but the topology says world_size " + std::to_string(this->topo_.world_size) + ", rank " +
          std::to_string(this->topo_.rank) +
          ". Fix: pass the communicator of this tensor-parallel group (e.g. from ncclCommSplit), with ranks numbered "
          "like the bootstrap's.");
    }
    if (device != this->platform_.device()) {
      throw std::invalid_argument(
          "fiar: the NCCL communicator given to the nccl workspace on rank " + std::to_string(this->topo_.rank) +
          " runs on CUDA device " + std::to_string(device) + ", but the workspace was created with device " +
          std::to_string(this->platform_.device()) +
          " current. Fix: cudaSetDevice(" + std::to_string(device) + ") before creating the workspace.");
    }
  }

  // A collective that ncclAllReduce did not enqueue at once: wait (bounded) for a non-blocking communicator
  // to finish enqueueing, so that the epilogue kernel follows it on the stream; fail on an error.
  void enqueued(ncclResult_t r, const std::string& call) {
    const char* hint = "every rank calls the same collectives with the same num_tokens, and in, out and the stream "
                       "belong to this rank's device";
    if (r == ncclInProgress) {
      r = detail::nccl_wait(comm_.get(), std::chrono::steady_clock::now() + this->cfg_.timeout);
      if (r == ncclInProgress) {
        const bool owned = comm_.owned();
        comm_.abort();
        fail(3, 0,
             "fiar: " + call + " was still being enqueued after " + std::to_string(this->cfg_.timeout.count()) +
                 " ms (ncclInProgress)" + (owned ? "; the communicator was aborted" : "") +
                 ". Fix: find the rank that did not make this call; recreate the workspace on every rank.");
      }
    }
    if (r != ncclSuccess) {
      fail(1, static_cast<int>(r), detail::nccl_failure_text(call, r, hint, comm_.get()));
    }
  }

  // Times the call just enqueued (not captured), unless an earlier one is still being timed: so a hang is
  // noticed even while later calls keep coming.
  void watch(cudaStream_t stream) {
    if (pending_) return;
    detail::cuda_check(cudaEventRecord(done_.get(), stream), "cudaEventRecord (timing the nccl workspace's call)",
                       "the stream belongs to device " + std::to_string(this->platform_.device()));
    pending_ = true;
    pending_since_ = std::chrono::steady_clock::now();
    pending_call_ = calls_;
  }
#endif

  // Records a failure that makes the workspace unusable, and throws it.
  [[noreturn]] void fail(int kind, int status, const std::string& what) const {
    failure_ = what;
    failure_kind_ = kind;
    failure_status_ = status;
    rethrow_failure();
    throw std::logic_error(what);  // unreachable
  }
  void rethrow_failure() const {
    if (failure_.empty()) return;
    if (failure_kind_ == 3) throw timeout_error(failure_);
    throw cuda_error(failure_, failure_status_);
  }

  mutable detail::NcclCommHandle comm_;  ///< declared before the event and after the platform (in Base)
  detail::CudaEvent done_;               ///< recorded after a timed call
  T* sum_ = nullptr;                     ///< [max_token_num, hidden_dim] device memory (the platform owns it)
  std::uint64_t calls_ = 0;
  mutable bool pending_ = false;
  mutable std::chrono::steady_clock::time_point pending_since_{};
  mutable std::uint64_t pending_call_ = 0;
  mutable std::string failure_;
  mutable int failure_kind_ = 0;
  mutable int failure_status_ = 0;
  bool valid_ = false;
};

}  // namespace fiar::inline v0_1
