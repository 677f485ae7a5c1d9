// SPDX-License-Identifier: Apache-2.0
// fiar/backend/nccl.hpp — the nccl backend, the fallback that works on any topology: the sum is a library all-reduce
// (ncclAllReduce on CudaPlatform; a plain host reduction among the emulated ranks on HostPlatform), then the fused
// epilogue is an operation of its own (NcclEpilogue over algo/epilogue_pass.hpp).
// Contract: the interface of every workspace (backend/workspace.hpp: collective verified creation, calls validated
// before anything runs, bounded waits, move-only); NCCL is optional at build time (FIAR_HAS_NCCL): without it the
// CUDA workspace still compiles and its creation throws std::invalid_argument on every rank.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../algo/convert.hpp"
#include "../algo/epilogue.hpp"
#include "../algo/epilogue_pass.hpp"
#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/errors.hpp"
#include "../core/log.hpp"
#include "../core/pattern.hpp"
#include "../core/policy.hpp"
#include "../core/prelude.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../exec/atomics.hpp"
#include "../platform/cuda.hpp"
#include "../platform/host.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/nccl.hpp"
#include "validate.hpp"
#include "workspace.hpp"

/// The operations this backend launches (<fiar/instantiate.cuh> emits one kernel per operation x pattern x dtype).
#define FIAR_NCCL_OPERATIONS(X) X(NcclEpilogue)

FIAR_BEGIN_NAMESPACE

/// The nccl backend's kernel: the fused epilogue over the sum ncclAllReduce wrote.
template <Pattern P, class T>
struct NcclEpilogue : algo::EpiloguePass<P, T> {
  static constexpr const char* name = "nccl epilogue";
};

namespace detail {

/// What the nccl workspaces of both platforms share: sizing, the strategy rules, the accessors.
template <ReduceType T, class Pf>
class NcclWorkspaceBase {
 public:
  // No Lamport buffer to bound (unlike trtllm / mnnvl): the checks every backend runs are all nccl needs.
  static std::string config_error(const Topology&, const WorkspaceConfig& cfg) { return common_config_error<T>(cfg); }

  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Pf& platform() { return platform_; }
  [[nodiscard]] int arch() const { return platform_.arch() != 0 ? platform_.arch() : topo_.arch; }
  [[nodiscard]] const StrategyThresholds& strategy_thresholds() const { return thresholds_; }
  /// The nccl backend is NCCL: Strategy::Nccl always runs.
  [[nodiscard]] bool has_nccl_route() const { return true; }
  [[nodiscard]] const std::string& nccl_route_reason() const {
    static const std::string none;
    return none;
  }

  /// Always Strategy::Auto: the nccl backend has no one-shot / two-shot choice of its own (NCCL picks its algorithm,
  /// ring, tree or NVLS, inside ncclAllReduce). A forced strategy other than Nccl is rejected by every call.
  [[nodiscard]] Strategy strategy_for(int) const { return Strategy::Auto; }
  [[nodiscard]] Strategy last_strategy() const { return last_strategy_; }
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s) const {
    return num_tokens >= 1 && num_tokens <= cfg_.max_token_num && (s == Strategy::Auto || s == Strategy::Nccl);
  }
  [[nodiscard]] std::string strategy_error(int, Strategy s) const {
    if (s == Strategy::Auto || s == Strategy::Nccl) return "";
    return "strategy " + std::string(to_string(s)) +
           "; the nccl backend has no one-shot / two-shot choice (NCCL picks its own algorithm). Fix: pass "
           "Strategy::Auto (or Nccl).";
  }

 protected:
  NcclWorkspaceBase(const typename Pf::Options& options, const Topology& topo, const WorkspaceConfig& cfg,
                    const CreationExtras& agreed)
      : platform_(options), topo_(topo), cfg_(cfg), thresholds_(agreed.thresholds) {}

  /// The creation extras of both platforms: the nccl row of the strategy table, no Lamport strategies.
  static CreationExtras extras_of(const Topology& topo, const WorkspaceConfig& cfg, std::size_t buffer_words) {
    return CreationExtras{buffer_words, fiar::strategy_thresholds(Backend::Nccl, topo, cfg), false};
  }

  static int vecs_per_token(int hidden_dim) {
    return static_cast<int>(static_cast<std::size_t>(hidden_dim) * sizeof(T) / 16);
  }
  /// Bytes of one [max_token_num, hidden_dim] tensor of T.
  static std::size_t activation_bytes(const WorkspaceConfig& cfg) {
    return static_cast<std::size_t>(cfg.max_token_num) * static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
  }

  // The epilogue of a fused call over `sum`, launched on the platform (after the sum is complete on `stream`).
  template <Pattern P>
  void run_epilogue(const FusedArgs<T>& a, const T* sum, cudaStream_t stream) {
    const algo::EpiloguePassParams<T> p{sum, nullptr, a.num_tokens, vecs_per_token(cfg_.hidden_dim),
                                        algo::epilogue_params(a, cfg_.hidden_dim)};
    platform_.template launch<NcclEpilogue<P, T>>(p, stream);
  }

  Pf platform_;
  Topology topo_;
  WorkspaceConfig cfg_;
  StrategyThresholds thresholds_;  ///< as agreed at creation (the nccl row, or the route's Lamport workspace's)
  Strategy last_strategy_ = Strategy::Auto;
};

template <ReduceType T, class Pf>
class NcclWorkspace;

// ---------------------------------------------------------------------------------------------------------------
// HostPlatform: the emulated ranks reduce through a shared host region, then the epilogue runs on the grid.
// ---------------------------------------------------------------------------------------------------------------

/// The nccl backend on the host emulator. No NCCL is involved: each call copies this rank's input into its block of a
/// region every rank sees, waits (bounded) until every rank has done so, sums all blocks in rank order in fp32
/// (identical bits on every rank, the same numerics as the trtllm backend), waits until every rank has read, then
/// runs the fused epilogue on the emulated grid. Calls are synchronous.
template <ReduceType T>
class NcclWorkspace<T, HostPlatform> : public NcclWorkspaceBase<T, HostPlatform> {
  using Base = NcclWorkspaceBase<T, HostPlatform>;

 public:
  /// Bytes each rank allocates: its block of the shared region (arrival words + one [max_token_num, hidden_dim]
  /// input) and the local sum buffer of the fused patterns.
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return block_bytes(topo.world_size, cfg) + Base::activation_bytes(cfg);
  }
  static CreationExtras creation_extras(const Topology& topo, const WorkspaceConfig& cfg) {
    return Base::extras_of(topo, cfg, block_bytes(topo.world_size, cfg) / 4);
  }

  template <Bootstrap B>
  NcclWorkspace(const CreationExtras& agreed, B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                const HostPlatformOptions& options)
      : Base(options, topo, cfg, agreed) {
    // Zero-filled, and handed out with a barrier: every arrival word starts at 0 on every rank.
    blocks_ = this->platform_.allocate_shared(boot, block_bytes(topo.world_size, cfg));
    sum_ = Borrowed(static_cast<T*>(this->platform_.allocate_local(Base::activation_bytes(cfg), "the sum buffer")));
  }

  void begin_call(cudaStream_t) { check(); }

  template <Pattern P>
  void launch(const FusedArgs<T>& a, cudaStream_t, Strategy) {
    const auto deadline = std::chrono::steady_clock::now() + this->cfg_.timeout;
    const std::uint64_t call = calls_++;
    const std::size_t count = static_cast<std::size_t>(a.num_tokens) * static_cast<std::size_t>(this->cfg_.hidden_dim);
    // Sequence numbers of this call's two arrivals: consecutive calls' barriers cannot be confused.
    const auto arrival = static_cast<std::uint32_t>(2 * call + 1);

    std::memcpy(data_of(this->topo_.rank), a.in, count * sizeof(T));
    const algo::CallDigest mine{static_cast<std::uint32_t>(call & 0x7fffffffu),
                                static_cast<std::uint32_t>(a.num_tokens), static_cast<std::uint32_t>(P), 0u};
    if (this->cfg_.verify_calls) publish_digest(mine);
    if (!arrive_and_wait(arrival, deadline, call, "waiting for the input of rank(s) ")) check();
    if (this->cfg_.verify_calls) compare_digests(mine);
    T* sum = P == Pattern::AllReduce ? a.out : sum_.get();
    reduce(sum, count);
    // Nobody overwrites its block (next call) before every rank has read it.
    if (!arrive_and_wait(arrival + 1, deadline, call, "waiting for rank(s) ")) check();
    if constexpr (P != Pattern::AllReduce) this->template run_epilogue<P>(a, sum, nullptr);
    this->last_strategy_ = Strategy::Auto;
  }

  /// Test hook (Workspace::testing_set_call_counter): calls numbered from `call` on, the arrival sequence with them
  /// (this rank's word as if call - 1 had completed). Every rank sets the same value between two calls, then meets.
  void set_call_counter(std::uint32_t call) {
    calls_ = call;
    exec::SystemAtomics::store_release(blocks_[0] + this->topo_.rank, static_cast<std::uint32_t>(2 * calls_));
  }

  /// Throws fiar::mismatch_error if a call of this workspace found a rank's call digest different from its own, and
  /// fiar::timeout_error if one gave up waiting for a rank (then every later call throws the same: recreate the
  /// workspace on every rank).
  void check() const {
    if (!sum_) throw std::logic_error(moved_from_text("workspace"));
    if (mismatch_) throw mismatch_error(failure_);
    if (!failure_.empty()) throw timeout_error(failure_);
  }

 private:
  // Rank 0's block starts with one arrival word per rank; every block then holds its rank's call digest (4 words
  // after the arrival words) and one [max_token_num, hidden_dim] input, 64-byte aligned.
  static std::size_t header_bytes(int world_size) {
    return (static_cast<std::size_t>(world_size + 4) * sizeof(std::uint32_t) + 63) / 64 * 64;
  }
  std::uint32_t* digest_of(int rank) const { return blocks_[static_cast<std::size_t>(rank)] + this->topo_.world_size; }
  // Written before this rank's arrival (a release store), read by the peers after they saw it.
  void publish_digest(const algo::CallDigest& d) const {
    std::uint32_t* w = digest_of(this->topo_.rank);
    const std::uint32_t words[4] = {d.call, d.num_tokens, d.pattern, d.strategy};
    for (int i = 0; i < 4; ++i) exec::SystemAtomics::store_relaxed(w + i, words[i]);
  }
  // Every rank compares every digest after the first arrival, so all of them raise together on a mismatch (none
  // waits at the second arrival) and none has reduced data from a different call.
  void compare_digests(const algo::CallDigest& mine) {
    for (int r = 0; r < this->topo_.world_size; ++r) {
      const std::uint32_t* w = digest_of(r);
      const algo::CallDigest theirs{exec::SystemAtomics::load_relaxed(w), exec::SystemAtomics::load_relaxed(w + 1),
                                    exec::SystemAtomics::load_relaxed(w + 2), exec::SystemAtomics::load_relaxed(w + 3)};
      if (!(theirs == mine)) {
        failure_ = call_mismatch_text("nccl", this->topo_.rank, mine, r, theirs);
        mismatch_ = true;
        check();
      }
    }
  }
  static std::size_t block_bytes(int world_size, const WorkspaceConfig& cfg) {
    return header_bytes(world_size) + Base::activation_bytes(cfg);
  }
  T* data_of(int rank) const {
    return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(blocks_[static_cast<std::size_t>(rank)]) +
                                header_bytes(this->topo_.world_size));
  }

  // Publishes this rank's arrival `target` and waits until every rank's word has reached it, or the deadline passes
  // (then records which ranks are missing and returns false).
  bool arrive_and_wait(std::uint32_t target, std::chrono::steady_clock::time_point deadline, std::uint64_t call,
                       const char* waited) {
    std::uint32_t* words = blocks_[0];
    const int world = this->topo_.world_size;
    exec::SystemAtomics::store_release(words + this->topo_.rank, target);
    auto behind = [&](int r) {
      return static_cast<std::int32_t>(exec::SystemAtomics::load_acquire(words + r) - target) < 0;
    };
    for (int r = 0; r < world; ++r) {
      for (int spin = 0; behind(r); ++spin) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::vector<int> missing;
          for (int m = 0; m < world; ++m) {
            if (behind(m)) missing.push_back(m);
          }
          failure_ = call_timeout_text("nccl", this->topo_.rank, this->cfg_.timeout, waited + rank_list(missing), call);
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

  // The sum of every rank's block in rank order, in fp32 from +0, rounded to T; a -0 result is written +0 (fiar's
  // documented numerics, bit-identical to the trtllm backend's).
  void reduce(T* out, std::size_t count) const {
    const int world = this->topo_.world_size;
    std::vector<const T*> in(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) in[static_cast<std::size_t>(r)] = data_of(r);
    for (std::size_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < world; ++r) acc += algo::to_float(in[static_cast<std::size_t>(r)][i]);
      T v = algo::from_float<T>(acc);
      if (algo::to_float(v) == 0.0f) v = algo::from_float<T>(0.0f);
      out[i] = v;
    }
  }

  std::vector<std::uint32_t*> blocks_;
  Borrowed<T> sum_;  ///< [max_token_num, hidden_dim]: the reduced sum of a fused call; null once moved from
  std::uint64_t calls_ = 0;
  std::string failure_;
  bool mismatch_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// CudaPlatform: ncclAllReduce on the caller's stream, then the epilogue kernel.
// ---------------------------------------------------------------------------------------------------------------

/// The nccl backend on GPUs: ncclAllReduce on the caller's stream (into `out`, or for the fused patterns into a
/// workspace-owned sum buffer), then the fused epilogue as a kernel of its own on the same stream. Works on any
/// topology NCCL supports (several nodes, PCIe-only machines). The communicator is created from the bootstrap
/// (owned), or an existing one is adopted (not owned). A host-side watchdog (check()) bounds every call.
template <ReduceType T>
class NcclWorkspace<T, CudaPlatform> : public NcclWorkspaceBase<T, CudaPlatform> {
  using Base = NcclWorkspaceBase<T, CudaPlatform>;

 public:
  /// Device bytes fiar allocates per rank: the [max_token_num, hidden_dim] sum buffer of the fused patterns (NCCL's
  /// own buffers come on top; see NCCL_BUFFSIZE).
  static std::size_t required_bytes(const Topology&, const WorkspaceConfig& cfg) { return Base::activation_bytes(cfg); }
  static CreationExtras creation_extras(const Topology& topo, const WorkspaceConfig& cfg) {
    return Base::extras_of(topo, cfg, Base::activation_bytes(cfg) / 4);
  }
  static std::string creation_error() {
    return built_with_nccl
               ? std::string()
               : built_without_nccl_text("Workspace<NcclPolicy, " + std::string(dtype_name<T>()) + ", CudaPlatform>");
  }
  static std::string adopt_error(NcclComm comm, const Topology& topo) {
    if (std::string e = creation_error(); !e.empty()) return e;
    if (comm != nullptr) return "";
    return "fiar: the nccl workspace on rank " + std::to_string(topo.rank) +
           " was asked to adopt a null ncclComm_t. Fix: pass an initialized communicator of this group, or use the "
           "constructor without a communicator, which creates one.";
  }

  template <Bootstrap B>
  NcclWorkspace(const CreationExtras& agreed, B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                const CudaPlatformOptions& options)
      : Base(options, topo, cfg, agreed) {
    create(boot, nullptr, false);
  }
  template <Bootstrap B>
  NcclWorkspace(const CreationExtras& agreed, B& boot, NcclComm comm, const Topology& topo, const WorkspaceConfig& cfg,
                const CudaPlatformOptions& options)
      : Base(options, topo, cfg, agreed) {
    create(boot, comm, true);
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

  template <Pattern P>
  void launch(const FusedArgs<T>& a, cudaStream_t stream, Strategy) {
#if FIAR_HAS_NCCL
    const std::size_t count = static_cast<std::size_t>(a.num_tokens) * static_cast<std::size_t>(this->cfg_.hidden_dim);
    // Symmetric (up to nccl_symmetric_max_bytes): the input is copied into the registered window, reduced there in
    // place by NCCL's symmetric kernel, and read from there (a copy into out, or the epilogue). Classic (no window,
    // or a larger call, where the copies cost more than the symmetric kernels save): NCCL reads in and writes out (or
    // the sum buffer).
    const bool in_window = symmetric_ && count * sizeof(T) <= this->thresholds_.nccl_symmetric_max_bytes;
    T* window = in_window ? static_cast<T*>(window_.get()) : nullptr;
    const T* sum = window != nullptr ? window : P == Pattern::AllReduce ? a.out : sum_.get();
    {
      DeviceGuard guard(this->platform_.device());
      const std::size_t bytes = count * sizeof(T);
      if (window != nullptr) {
        cuda_check(cudaMemcpyAsync(window, a.in, bytes, cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpyAsync (the input into the nccl workspace's symmetric window)",
                   [&] { return "in and the stream belong to device " + std::to_string(this->platform_.device()); });
      }
      const ncclResult_t r = ncclAllReduce(window != nullptr ? window : a.in, const_cast<T*>(sum), count,
                                           nccl_type<T>(), ncclSum, comm_.get(), stream);
      if (r != ncclSuccess) {  // the call's text only now: no string on the success path
        enqueued(r, "ncclAllReduce(" + std::to_string(count) + " x " + std::string(dtype_name<T>()) + ", " +
                        to_string(P) + (window != nullptr ? ", symmetric window" : "") + ") on rank " +
                        std::to_string(this->topo_.rank));
      }
      if (window != nullptr && P == Pattern::AllReduce) {
        cuda_check(cudaMemcpyAsync(a.out, window, bytes, cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpyAsync (the sum out of the nccl workspace's symmetric window)",
                   [&] { return "out belongs to device " + std::to_string(this->platform_.device()); });
      }
    }
    if constexpr (P != Pattern::AllReduce) this->template run_epilogue<P>(a, sum, stream);
    if (!capturing_) watch(stream);
    ++calls_;
    this->last_strategy_ = Strategy::Auto;
#else
    (void)a;
    (void)stream;
    throw std::logic_error("fiar: unreachable: a nccl workspace cannot exist in a build without NCCL");
#endif
  }

  /// Throws fiar::cuda_error when the communicator reports an asynchronous error, and fiar::timeout_error when a
  /// call has not finished cfg.timeout after it was enqueued (an owned communicator is then aborted, which ends
  /// NCCL's waiting kernels). After either, every later call throws the same: recreate the workspace on every rank.
  /// Calls made while the stream is being captured into a CUDA graph are not timed.
  void check() const { check_state(true); }

  /// Test hook (Workspace::testing_set_call_counter): calls numbered from `call` on (names in errors only here).
  void set_call_counter(std::uint32_t call) { calls_ = call; }

 private:
  // check(); `timed` false skips the timing of the pending call (while the caller's stream is captured).
  void check_state(bool timed) const {
    if (!sum_) throw std::logic_error(moved_from_text("workspace"));
    if (failure_.failed()) raise(failure_, failure_.message());
#if FIAR_HAS_NCCL
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_.get(), &state);
    if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t bad = q != ncclSuccess ? q : state;
      fail(StepOutcome::kCuda, static_cast<int>(bad),
           nccl_failure_text("the nccl workspace's communicator on rank " + std::to_string(this->topo_.rank) +
                                 " (ncclCommGetAsyncError)",
                             bad,
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
                                 " on rank " + std::to_string(this->topo_.rank) + ")",
                             e, "the device is healthy; a kernel on the stream may have faulted"));
    }
    if (std::chrono::steady_clock::now() - pending_since_ > this->cfg_.timeout) {
      const bool owned = comm_.owned();
      comm_.abort();
      fail(StepOutcome::kTimeout, 0,
           "fiar: nccl all-reduce on rank " + std::to_string(this->topo_.rank) + " has not finished " +
               std::to_string(this->cfg_.timeout.count()) + " ms after call " + std::to_string(pending_call_) +
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
  void create(B& boot, NcclComm adopted, bool adopt) {
#if FIAR_HAS_NCCL
    const auto deadline = std::chrono::steady_clock::now() + this->cfg_.timeout;
    // Step 1: the GPU, the sum buffer, the timing event; the adopted communicator checked, or rank 0's unique id for
    // a new one.
    std::array<char, 128> unique_id{};
    static_assert(sizeof(ncclUniqueId) <= sizeof(unique_id));
    const auto ids =
        agree(boot, attempt([&] {
                this->platform_.synchronize();  // raises the platform's own setup failure (no GPU, bad options)
                sum_ = Borrowed(static_cast<T*>(this->platform_.allocate_local(Base::activation_bytes(this->cfg_),
                                                                               "the nccl workspace's sum buffer")));
                DeviceGuard guard(this->platform_.device());
                done_ = make_event(this->platform_.device(), "nccl workspace");
                if (adopt) {
                  check_adopted(adopted, deadline);
                  comm_ = NcclCommHandle(adopted, false, this->cfg_.timeout);
                } else if (this->topo_.rank == 0) {
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
      DeviceGuard guard(this->platform_.device());
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      NcclComm comm = nullptr;
      const std::string call = "ncclCommInitRankConfig(" + std::to_string(this->topo_.world_size) + " ranks, rank " +
                               std::to_string(this->topo_.rank) + ", device " +
                               std::to_string(this->platform_.device()) + ")";
      const char* hint =
          "every rank of the group creates the workspace at the same time, each on its own GPU (NCCL cannot put two "
          "ranks of one communicator on one GPU), and the ranks can reach each other (NCCL_DEBUG=INFO)";
      const ncclResult_t r = ncclCommInitRankConfig(&comm, this->topo_.world_size, id, this->topo_.rank, &config);
      if (comm != nullptr) comm_ = NcclCommHandle(comm, true, this->cfg_.timeout);
      nccl_check(r, call, hint, comm);
      const ncclResult_t ready = comm != nullptr ? nccl_wait(comm, deadline) : ncclInternalError;
      if (ready == ncclInProgress) {
        comm_.abort();
        throw timeout_error("fiar: " + call + " did not finish within " + std::to_string(this->cfg_.timeout.count()) +
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
    (void)boot;
    (void)adopted;
    (void)adopt;
    throw std::logic_error("fiar: unreachable: creation agreed on a nccl workspace in a build without NCCL");
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
    } else if (this->thresholds_.nccl_symmetric_max_bytes == 0) {
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
      DeviceGuard guard(this->platform_.device());
      const std::size_t align = NCCL_WIN_REQUIRED_ALIGNMENT;
      // Only as large as the largest call that takes it (larger ones run in place on the caller's buffers).
      const std::size_t used = std::min(Base::activation_bytes(this->cfg_), this->thresholds_.nccl_symmetric_max_bytes);
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
        throw timeout_error("fiar: " + call + " did not finish within " + std::to_string(this->cfg_.timeout.count()) +
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
    if (this->topo_.rank != 0 || !log_enabled(LogLevel::Info)) return;
    const int v = nccl_runtime_version();
    const std::string version =
        std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    log(LogLevel::Info,
        "nccl workspace: NCCL " + version + ", " +
            (symmetric_ ? "symmetric window registered: ncclAllReduce runs NCCL's symmetric kernels for calls up to " +
                              std::to_string(this->thresholds_.nccl_symmetric_max_bytes) +
                              " bytes per rank, in place on the caller's buffers beyond"
                        : "classic ncclAllReduce (" + classic_reason_ + ")"));
  }

  // An adopted communicator must describe this very group on this very GPU.
  void check_adopted(NcclComm comm, std::chrono::steady_clock::time_point deadline) const {
    const char* valid = "the communicator is valid and initialized";
    const ncclResult_t ready = nccl_wait(comm, deadline);
    if (ready == ncclInProgress) {
      throw timeout_error("fiar: the NCCL communicator given to the nccl workspace on rank " +
                          std::to_string(this->topo_.rank) + " was still initializing after " +
                          std::to_string(this->cfg_.timeout.count()) +
                          " ms. Check: every rank called ncclCommInitRank(Config) with the same unique id.");
    }
    nccl_check(ready, "ncclCommGetAsyncError (the adopted communicator)", valid, comm);
    int count = 0, rank = -1, device = -1;
    nccl_check(ncclCommCount(comm, &count), "ncclCommCount (the adopted communicator)", valid, comm);
    nccl_check(ncclCommUserRank(comm, &rank), "ncclCommUserRank (the adopted communicator)", valid, comm);
    nccl_check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice (the adopted communicator)", valid, comm);
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
      throw std::invalid_argument("fiar: the NCCL communicator given to the nccl workspace on rank " +
                                  std::to_string(this->topo_.rank) + " runs on CUDA device " + std::to_string(device) +
                                  ", but the workspace was created with device " +
                                  std::to_string(this->platform_.device()) + " current. Fix: cudaSetDevice(" +
                                  std::to_string(device) + ") before creating the workspace.");
    }
  }

  // A collective that ncclAllReduce did not enqueue at once: wait (bounded) for a non-blocking communicator to finish
  // enqueueing, so that the epilogue kernel follows it on the stream; fail on an error.
  void enqueued(ncclResult_t r, const std::string& call) {
    const char* hint =
        "every rank calls the same collectives with the same num_tokens, and in, out and the stream "
        "belong to this rank's device";
    if (r == ncclInProgress) {
      r = nccl_wait(comm_.get(), std::chrono::steady_clock::now() + this->cfg_.timeout);
      if (r == ncclInProgress) {
        const bool owned = comm_.owned();
        comm_.abort();
        fail(StepOutcome::kTimeout, 0,
             "fiar: " + call + " was still being enqueued after " + std::to_string(this->cfg_.timeout.count()) +
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
               [&] { return "the stream belongs to device " + std::to_string(this->platform_.device()); });
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

  NcclMemory window_;  ///< the symmetric window's memory: declared before comm_, freed after it is destroyed
  bool symmetric_ = false;
  std::string classic_reason_ = "an adopted communicator (register your own windows on it)";
  mutable NcclCommHandle comm_;  ///< declared after the platform (in the base): destroyed before its memory
  EventHandle done_;             ///< recorded after a timed call
  Borrowed<T> sum_;  ///< [max_token_num, hidden_dim] device memory (the platform owns it); null once moved from
  std::uint64_t calls_ = 0;
  bool capturing_ = false;  ///< the current call's stream is being captured
  mutable bool pending_ = false;
  mutable std::chrono::steady_clock::time_point pending_since_{};
  mutable std::uint64_t pending_call_ = 0;
  mutable StepOutcome failure_;
};

template <>
struct BackendImpl<NcclPolicy> {
  template <ReduceType T, class Pf>
  using type = NcclWorkspace<T, Pf>;
};

}  // namespace detail
FIAR_END_NAMESPACE
