// SPDX-License-Identifier: Apache-2.0
// fiar/backend/workspace.hpp — Workspace<P, T, Platform>: the all-reduce workspace of one backend and one element type.
// Inside, one or two engines its policy names: the Lamport engine (backend/lamport.hpp; trtllm and mnnvl) and the
// NCCL engine (backend/nccl.hpp; the nccl backend, and the NCCL route of the others). Every call is validated once
// and routed by the strategy table; every query is answered once, by detail::WorkspaceCore.
// Contract: Workspace exists only for an AllreducePolicy P, a ReduceType T and a Platform; naming it with anything
// else is a compile error naming the unmet concept. Creation is collective and verified through comm/agree.hpp (every
// rank agrees on the configuration or every rank throws the same error, before anything is allocated); every call is
// validated (backend/validate.hpp) before anything is launched, and builds no string unless it fails.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "../algo/moe.hpp"
#include "../algo/user_epilogue.hpp"
#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/backend.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/errors.hpp"
#include "../core/log.hpp"
#include "../core/pattern.hpp"
#include "../core/policy.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../core/version.hpp"
#include "../exec/atomics.hpp"
#include "../platform/concept.hpp"
#include "../platform/cuda.hpp"
#include "../runtime/nccl.hpp"
#include "../runtime/posix.hpp"
#include "lamport.hpp"
#include "mnnvl.hpp"
#include "nccl.hpp"
#include "streams.hpp"
#include "trtllm.hpp"
#include "validate.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// The engine slot of a policy that has no such engine.
struct NoEngine {};

/// The Lamport engine a policy names (none for a policy without fiar's kernels): its operations, and through the
/// policy its transport.
template <class P, ReduceType T, class Pf>
struct LamportOf {
  using type = NoEngine;
};
template <ReduceType T, class Pf>
struct LamportOf<TrtllmPolicy, T, Pf> {
  using type = LamportEngine<T, Pf, TrtllmPolicy, TrtllmOneShot, TrtllmTwoShot>;
};
template <ReduceType T, class Pf>
struct LamportOf<MnnvlPolicy, T, Pf> {
  using type = LamportEngine<T, Pf, MnnvlPolicy, MnnvlOneShot, MnnvlTwoShot, MnnvlMultimem>;
};

/// What every Workspace<P, T, Platform> of one element type and platform shares: the platform, the group, the
/// configuration, the strategy table's row, and every query about them, written once. AnyWorkspace answers its
/// queries from it without knowing the backend.
template <ReduceType T, Platform Pf>
class WorkspaceCore {
 public:
  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Pf& platform() { return platform_; }
  /// The architecture the kernels run on: the GPU's on CudaPlatform, the topology's on the host emulator.
  [[nodiscard]] int arch() const { return platform_.arch() != 0 ? platform_.arch() : topo_.arch; }
  /// The row of the strategy table this workspace resolved at creation (the same on every rank): where
  /// Strategy::Auto changes path. The nccl backend applies only nccl_symmetric_max_bytes (its other fields are 0 or
  /// fiar::never).
  [[nodiscard]] const StrategyThresholds& strategy_thresholds() const { return thresholds_; }
  /// The strategy the last call ran.
  [[nodiscard]] Strategy last_strategy() const { return last_strategy_; }
  /// Whether Strategy::Nccl can run: trtllm / mnnvl when creation set up the NCCL route (a call of max_token_num
  /// tokens reaches nccl_min_bytes and the route could be set up); always on the nccl backend.
  [[nodiscard]] bool has_nccl_route() const { return route_; }
  /// Why there is no NCCL route ("" when there is one).
  [[nodiscard]] const std::string& nccl_route_reason() const { return route_reason_; }

  /// The strategy Strategy::Auto takes for a call of num_tokens tokens (the same on every rank). Auto on the nccl
  /// backend, which has no choice of its own (NCCL picks its algorithm, ring, tree or NVLS, inside ncclAllReduce).
  [[nodiscard]] Strategy strategy_for(int num_tokens) const {
    if (!lamport_) return Strategy::Auto;
    return choose_strategy(thresholds_, topo_.world_size, num_tokens, message_bytes(num_tokens), multicast_, route_);
  }

  /// Whether one call of num_tokens tokens with strategy s fits: one of the three Lamport buffers backs a call, so
  /// this is the real per-call capacity (not total bytes / row bytes).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    if (num_tokens < 1 || num_tokens > cfg_.max_token_num || !is_valid(s)) return false;
    if (!lamport_) return s == Strategy::Auto || s == Strategy::Nccl;
    if (s == Strategy::Multimem && !multicast_) return false;
    if (s == Strategy::Auto) s = strategy_for(num_tokens);
    if (s == Strategy::Nccl) return route_;  // the NCCL engine holds max_token_num
    return lamport_call_words(s, topo_.world_size, num_tokens, algo::detail::vecs_per_token<T>(cfg_.hidden_dim)) <=
           data_words_;
  }

 protected:
  WorkspaceCore(const typename Pf::Options& options, Backend backend, bool lamport, bool multicast,
                const Topology& topo, const WorkspaceConfig& cfg, const StrategyThresholds& thresholds)
      : platform_(options),
        topo_(topo),
        cfg_(cfg),
        thresholds_(thresholds),
        backend_(backend),
        lamport_(lamport),
        multicast_(multicast),
        route_(!lamport) {}

  /// Per-rank bytes of a call of num_tokens tokens.
  [[nodiscard]] std::size_t message_bytes(int num_tokens) const {
    return static_cast<std::size_t>(num_tokens) * static_cast<std::size_t>(cfg_.hidden_dim) * sizeof(T);
  }
  /// The most tokens a call on the Lamport buffers can have: max_token_num, or with the route the largest call below
  /// nccl_min_bytes (larger ones are the route's).
  [[nodiscard]] int lamport_tokens() const {
    if (!lamport_ || !route_) return cfg_.max_token_num;
    const std::size_t row = message_bytes(1), from = thresholds_.nccl_min_bytes;
    const std::size_t below = from <= row ? 1 : (from - 1) / row;
    return static_cast<int>(std::min<std::size_t>(std::max<std::size_t>(below, 1), cfg_.max_token_num));
  }

  /// Every check of a call of the epilogue named `epilogue` before anything runs (nothing changes when one fails; text
  /// is built only then): the call's basics, the strategy, then the epilogue's own rules (`validate`); returns the
  /// strategy it runs: Auto resolved by the table (Auto on the nccl backend).
  template <class Validate>
  Strategy checked_strategy(const char* epilogue, bool needs_out, const T* in, const T* out, int num_tokens,
                            Strategy strategy, Validate&& validate) const {
    validate_call_basics(topo_.rank, epilogue, needs_out, strategy, in, out, num_tokens, cfg_.max_token_num);
    if (!strategy_fits(num_tokens, strategy)) {
      throw std::invalid_argument(call_where(epilogue, topo_.rank) + strategy_error(num_tokens, strategy));
    }
    validate();
    if (!lamport_) return Strategy::Auto;
    return strategy == Strategy::Auto ? strategy_for(num_tokens) : strategy;
  }

  Pf platform_;
  Topology topo_;
  WorkspaceConfig cfg_;
  StrategyThresholds thresholds_;  ///< as agreed at creation
  Backend backend_;
  bool lamport_;                ///< the Lamport engine runs the calls the table gives it (trtllm, mnnvl)
  bool multicast_;              ///< the in-switch reduction can run (mnnvl)
  bool route_;                  ///< the NCCL engine exists (always on nccl; trtllm / mnnvl: their NCCL route)
  std::size_t data_words_ = 0;  ///< words of one Lamport buffer for a call's data, after its header of digests
  std::string route_reason_;    ///< why there is no NCCL route ("" when there is one)
  Strategy last_strategy_ = Strategy::Auto;

 private:
  // Whether a forced strategy can run a call of num_tokens tokens (Auto always can).
  [[nodiscard]] bool strategy_fits(int num_tokens, Strategy s) const {
    if (s == Strategy::Auto) return true;
    if (lamport_ && cfg_.batch_invariant && (s == Strategy::Multimem || s == Strategy::Nccl)) return false;
    return is_buffer_size_sufficient(num_tokens, s);
  }

  // Why a forced strategy cannot run a call of num_tokens tokens (strategy_fits is false).
  [[nodiscard]] std::string strategy_error(int num_tokens, Strategy s) const {
    const std::string name(to_string(backend_));
    if (!lamport_) {
      return "strategy " + std::string(to_string(s)) +
             "; the nccl backend has no one-shot / two-shot choice (NCCL picks its own algorithm). Fix: pass "
             "Strategy::Auto (or Nccl).";
    }
    if (cfg_.batch_invariant && (s == Strategy::Multimem || s == Strategy::Nccl)) {
      return std::string(s == Strategy::Multimem ? "multimem (the in-switch reduction)"
                                                 : "strategy nccl (the NCCL route)") +
             " sums in an order that follows the message size, and this workspace was created with "
             "WorkspaceConfig::batch_invariant = true. Fix: use Strategy::Auto, OneShot or TwoShot, or create the "
             "workspace with batch_invariant = false.";
    }
    if (s == Strategy::Multimem && !multicast_) {
      return "multimem (the in-switch reduction) needs NVLink multicast: it runs on the mnnvl backend only. Fix: use "
             "Strategy::Auto, OneShot or TwoShot on " +
             name + ", or the mnnvl backend.";
    }
    if (s == Strategy::Nccl && !route_) {
      return "strategy nccl needs the workspace's NCCL route, and this " + name +
             " workspace has none: " + route_reason_ +
             ". Fix: use Strategy::Auto, or create the workspace with WorkspaceConfig::nccl_min_bytes at most the "
             "bytes of its largest call (max_token_num x hidden_dim x sizeof(T) = " +
             std::to_string(message_bytes(cfg_.max_token_num)) + ").";
    }
    if (route_ && num_tokens > lamport_tokens()) {
      return std::string(to_string(s)) + " with num_tokens = " + std::to_string(num_tokens) +
             ": calls from nccl_min_bytes = " + std::to_string(thresholds_.nccl_min_bytes) +
             " bytes per rank are the NCCL route's, and this workspace's Lamport buffers hold at most " +
             std::to_string(lamport_tokens()) +
             " tokens. Fix: use Strategy::Auto or Nccl, or create the workspace with a larger nccl_min_bytes (or "
             "fiar::never).";
    }
    return std::string(to_string(s)) + " with num_tokens = " + std::to_string(num_tokens) + " needs " +
           std::to_string(
               lamport_call_words(s, topo_.world_size, num_tokens, algo::detail::vecs_per_token<T>(cfg_.hidden_dim)) *
               4) +
           " bytes per Lamport buffer; this workspace has " + std::to_string(data_words_ * 4) +
           ". Fix: use Strategy::Auto, or create the workspace with oneshot_at_max_tokens.";
  }
};

}  // namespace detail

/// The per-group buffers and protocol state of backend P for element type T, on Platform (CudaPlatform: GPUs;
/// HostPlatform: the host emulator): the engines P names (see the header comment). Move-only.
template <AllreducePolicy P, ReduceType T, Platform Pf = CudaPlatform>
class Workspace : public detail::WorkspaceCore<T, Pf> {
  using Core = detail::WorkspaceCore<T, Pf>;
  using Lamport = typename detail::LamportOf<P, T, Pf>::type;
  using Nccl = detail::NcclEngine<T, Pf>;
  static constexpr bool kLamport = P::custom_kernels;
  static constexpr bool kAdopts = !kLamport && std::is_same_v<Pf, CudaPlatform>;

 public:
  using policy_type = P;
  using value_type = T;
  using platform_type = Pf;

  /// Bytes of memory each rank allocates for this configuration (see docs/api.md per backend): trtllm / mnnvl their
  /// Lamport region without the NCCL route (with it, less: the buffers hold only the calls below nccl_min_bytes;
  /// plus the route's own), nccl its sum buffer (host emulator: and its shared block).
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    if constexpr (kLamport) {
      return Lamport::region_bytes(buffer_words(topo.world_size, topo.arch, cfg), cfg);
    } else {
      return Nccl::required_bytes(topo, cfg);
    }
  }
  /// "" when this backend can serve the configuration on the topology, else the error creation would throw.
  static std::string why_not(const Topology& topo, const WorkspaceConfig& cfg) {
    // The topology first (check_topology validates it too): the configuration checks size buffers from it.
    if (std::string e = detail::topology_error<P>(topo); !e.empty()) return e;
    return config_error(topo, cfg);
  }
  /// A well-formed topology and an empty why_not().
  static bool can_implement(const Topology& topo, const WorkspaceConfig& cfg) {
    try {
      validate_topology(topo);
    } catch (const std::invalid_argument&) {
      return false;
    }
    return why_not(topo, cfg).empty();
  }
  /// Words of one Lamport buffer for this configuration (one of three; a call uses one), without the NCCL route.
  /// Lamport backends only.
  static std::size_t buffer_words(int world_size, int arch, const WorkspaceConfig& cfg)
    requires kLamport
  {
    const auto t = thresholds(Topology{.world_size = world_size, .arch = arch}, cfg);
    return Lamport::buffer_words(world_size, cfg, t.oneshot_max_bytes, cfg.max_token_num);
  }

  /// Collective: every rank of the group constructs its workspace with the same topology (bar rank) and
  /// configuration. Throws std::invalid_argument (on every rank alike) when the topology or configuration cannot
  /// work, before allocating anything; allocation and mapping failures on every rank alike too; fiar::timeout_error
  /// when a rank does not arrive. nccl on CudaPlatform creates (and owns) an NCCL communicator, and so do trtllm and
  /// mnnvl for their NCCL route when the largest call reaches the strategy table's nccl_min_bytes.
  template <Bootstrap B>
  Workspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg, const typename Pf::Options& options = {})
      : Core(options, P::backend, kLamport, P::needs_multicast, topo, cfg,
             agreed_thresholds(boot, topo, cfg, [] { return creation_error(); })) {
    if constexpr (kLamport) {
      create_route(boot);  // first: whether the route exists decides how many tokens the Lamport buffers hold
      const std::size_t words =
          Lamport::buffer_words(topo.world_size, cfg, this->thresholds_.oneshot_max_bytes, this->lamport_tokens());
      lamport_.emplace(this->platform_, boot, topo, cfg, words);
      this->data_words_ = words - algo::header_words(topo.world_size);
    } else {
      nccl_.emplace(this->platform_, boot, topo, cfg, this->thresholds_.nccl_symmetric_max_bytes);
    }
    allocate_index_error();
    agree_group(boot);
    warn_if_slow(topo);
  }

  /// Collective: adopts `comm`, an initialized NCCL communicator of exactly this group (same size, same rank
  /// numbers as the bootstrap, on the calling thread's current device). It is not owned: destroy it after this
  /// workspace. nccl on CudaPlatform only.
  template <Bootstrap B>
    requires kAdopts
  Workspace(B& boot, NcclComm comm, const Topology& topo, const WorkspaceConfig& cfg,
            const typename Pf::Options& options = {})
      : Core(options, P::backend, false, false, topo, cfg, agreed_thresholds(boot, topo, cfg, [&] {
               std::string e = creation_error();
               return e.empty() ? detail::NcclCollective::adopt_error(comm, topo) : e;
             })) {
    nccl_.emplace(this->platform_, boot, topo, cfg, this->thresholds_.nccl_symmetric_max_bytes, comm, true);
    allocate_index_error();
    agree_group(boot);
    warn_if_slow(topo);
  }

  Workspace(Workspace&&) noexcept = default;
  /// Releases this workspace first, in the order its destructor does (the engines before the platform's memory they
  /// use; nccl: the communicator before its window), then takes `other`'s; assigning a workspace to itself changes
  /// nothing.
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      std::destroy_at(this);
      std::construct_at(this, std::move(other));
    }
    return *this;
  }
  ~Workspace() = default;

  /// Sums `in` over all ranks into `out` ([num_tokens, hidden_dim] each; out may equal in), on `stream`
  /// (CudaPlatform). Collective: every rank calls it with the same num_tokens and strategy, in the same order.
  void allreduce(const T* in, T* out, int num_tokens, cudaStream_t stream = nullptr,
                 Strategy strategy = Strategy::Auto) {
    FusedArgs<T> a;
    a.in = in;
    a.out = out;
    a.num_tokens = num_tokens;
    run<Pattern::AllReduce>(a, stream, strategy);
  }

  /// The all-reduce fused with pattern Q's epilogue (residual add, RMSNorm, FP8 / NVFP4 quantization). Collective
  /// like allreduce(); `a` is checked against the pattern before anything is launched, and nothing changes when a
  /// check fails.
  template <Pattern Q>
  void run(const FusedArgs<T>& a, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    static_assert(is_valid(Q), "fiar: run<Q>: Q is not a Pattern enumerator");
    std::uint32_t moe_call = 0;
    if constexpr (epilogue_prologue<Q>() == Prologue::MoeFinalize) {
      moe_calls_ = (moe_calls_ + 1) & 0x7fffffffu;  // 31 bits (MoeIndexError::claim); 0 names no call
      if (moe_calls_ == 0) moe_calls_ = 1;
      moe_call = moe_calls_;
    }
    submit<Q>(algo::epilogue_params(a, this->cfg_.hidden_dim, index_error_.get(), moe_call), stream, strategy,
              Q == Pattern::AllReduce, [&] {
                detail::validate_fused<Q, T>(a, this->cfg_.hidden_dim, this->arch(), this->topo_.rank, this->platform_);
              });
  }

  /// The all-reduce of `in` ([num_tokens, hidden_dim]) fused with the user epilogue E (algo/user_epilogue.hpp): E's
  /// finish() gets each reduced token, with `params` (the user's tensors). Collective like allreduce(); `in` and (when
  /// E has one) E::why_not are checked before anything is launched. On CudaPlatform the module's nvcc translation unit
  /// emits E's kernels: FIAR_INSTANTIATE_EPILOGUE(E, T) (<fiar/instantiate.cuh>).
  template <class E>
    requires UserEpilogue<E, T>
  void run(const T* in, int num_tokens, const typename E::template Params<T>& params, cudaStream_t stream = nullptr,
           Strategy strategy = Strategy::Auto) {
    const int hidden = this->cfg_.hidden_dim;
    FusedArgs<T> a;
    a.in = in;
    a.num_tokens = num_tokens;
    algo::UserCallParams<E, T> epi{};
    static_cast<algo::EpilogueParams<T>&>(epi) = algo::epilogue_params(a, hidden);
    epi.user = params;
    submit<user_epilogue<E>>(epi, stream, strategy, false, [&] {
      detail::validate_user<E, T>(in, num_tokens, params, hidden, this->arch(), this->topo_.rank, this->platform_);
    });
  }

  /// Throws fiar::mismatch_error if a call of this workspace saw a peer's call digest differ from its own, and
  /// fiar::timeout_error once a call gave up waiting for a peer (then on every later call: recreate the workspace on
  /// every rank); nccl on CudaPlatform also fiar::cuda_error for an asynchronous NCCL error; std::logic_error on a
  /// moved-from workspace.
  /// A MoE finalize call that met an expanded_idx_to_permuted_idx entry outside [-1, num_permuted_rows) (treated as
  /// -1) makes the next check() throw std::invalid_argument naming it, once; the workspace stays usable.
  void check() const {
    if constexpr (kLamport) check_lamport();
    if (nccl_) nccl_->check();
    check_index_error();
  }

  /// Test hook, not for production: numbers this rank's next call `call` (the protocol's counter wraps at 2^32, every
  /// ~5-8 days of serving). Every rank of the group sets the same value once all have finished their previous call (a
  /// barrier before), and they meet again (a barrier) before the next call. Lets a test cross the wrap without 2^32
  /// calls.
  void testing_set_call_counter(std::uint32_t call) {
    if constexpr (kLamport) lamport_->set_call_counter(this->platform_, call);
    if (nccl_) nccl_->set_call_counter(call);
  }

  /// The per-rank message bytes up to which Strategy::Auto takes one-shot. Lamport backends only.
  [[nodiscard]] std::size_t oneshot_threshold() const
    requires kLamport
  {
    return this->thresholds_.oneshot_max_bytes;
  }

  /// The communicator the calls run on (owned or adopted; null after a timeout aborted it). nccl on CudaPlatform.
  [[nodiscard]] NcclComm comm() const
    requires kAdopts
  {
    return nccl_->collective().comm();
  }
  /// Whether the workspace created (and destroys) its communicator. nccl on CudaPlatform.
  [[nodiscard]] bool owns_comm() const
    requires kAdopts
  {
    return nccl_->collective().owns_comm();
  }
  /// Whether the calls run on NCCL's symmetric kernels (a symmetric window registered at creation: NCCL 2.27+, an
  /// owned communicator, FIAR_NCCL_SYMMETRIC not 0). nccl on CudaPlatform.
  [[nodiscard]] bool nccl_symmetric() const
    requires kAdopts
  {
    return nccl_->collective().symmetric();
  }
  /// Why the calls take classic ncclAllReduce ("" when nccl_symmetric()). nccl on CudaPlatform.
  [[nodiscard]] const std::string& nccl_classic_reason() const
    requires kAdopts
  {
    return nccl_->collective().classic_reason();
  }

 private:
  // Checks, routes and launches a call of epilogue E (a Pattern, or user_epilogue<U>): `epi` as its kernels get it,
  // `validate` the epilogue's own rules.
  template <auto E, class Validate>
  void submit(const algo::CallParams<E, T>& epi, cudaStream_t stream, Strategy strategy, bool needs_out,
              Validate&& validate) {
    const int hidden = this->cfg_.hidden_dim;
    if constexpr (requires { this->platform_.stream_key(stream); }) {
      if (streams_) streams_->claim(this->platform_.stream_key(stream));
    }
    if constexpr (kLamport) {
      check_lamport();
      if (nccl_) nccl_->check_recorded();  // a workspace whose route failed launches nothing any more
      const Strategy s =
          this->checked_strategy(to_string(E), needs_out, epi.in, epi.out, epi.num_tokens, strategy, validate);
      if (s == Strategy::Nccl) {
        nccl_->begin_call(stream);
        // The digest first, through the Lamport buffers (with verify_calls): a rank that runs this call there meets
        // it, and every rank raises mismatch_error instead of waiting for a collective the other never joins.
        lamport_->template announce<E>(this->platform_, epi.num_tokens, stream);
        if constexpr (Pf::synchronous) {
          detail::wait_if_queued(this->platform_, stream);  // the emulator's asynchronous mode: the digests first
          check_lamport();
        }
        nccl_->template launch<E>(this->platform_, epi, hidden, stream);
      } else {
        lamport_->template launch<E>(this->platform_, epi, s, stream);
        if constexpr (Pf::synchronous) check_lamport();
      }
      this->last_strategy_ = s;
    } else {
      nccl_->begin_call(stream);
      this->checked_strategy(to_string(E), needs_out, epi.in, epi.out, epi.num_tokens, strategy, validate);
      nccl_->template launch<E>(this->platform_, epi, hidden, stream);
    }
  }

  // Throws (once) the bad MoE index a call recorded, if any. `ready` first (acquire): the fields are whole then, and
  // no kernel writes them again until the claim is released, after `ready` (a kernel still running may then record a
  // later call's bad index, which the next check reports; never its own call's again: record_bad_index).
  void check_index_error() const {
    algo::MoeIndexError* e = index_error_.get();
    if (e == nullptr || Pf::read_word(&e->ready) == 0) return;
    const auto value = static_cast<std::int32_t>(Pf::read_word(&e->value));
    const std::uint32_t call = Pf::read_word(&e->call);
    const std::string text =
        "fiar: a MoE finalize call on rank " + std::to_string(this->topo_.rank) + ": expanded_idx_to_permuted_idx[" +
        std::to_string(Pf::read_word(&e->token)) + "][" + std::to_string(Pf::read_word(&e->k)) +
        "] = " + std::to_string(value) + "; allowed: -1 (no expert) or 0 to num_permuted_rows - 1 = " +
        std::to_string(static_cast<std::int32_t>(Pf::read_word(&e->rows)) - 1) +
        ". The kernel skipped it (as -1), so that token's outputs lack one expert. Fix: pass the map of the "
        "permutation that produced in, and its rows as num_permuted_rows.";
    exec::SystemAtomics::store_release(&e->ready, 0u);         // host memory on both platforms (allocate_host_visible)
    exec::SystemAtomics::store_release(&e->claim, call << 1);  // free, and that call reported
    throw std::invalid_argument(text);
  }

  // Throws the failure a Lamport call recorded (a peer's digest differed, or a peer never came), if any: the workspace
  // is unusable then, its route too. On GPUs an owned communicator is aborted first, so a routed call still waiting
  // for a rank that took the Lamport path ends instead of holding the stream until the timeout.
  void check_lamport() const
    requires kLamport
  {
    if (!lamport_->failed()) return;
    if (nccl_) nccl_->abandon();
    lamport_->raise_failure();
  }
  static StrategyThresholds thresholds(const Topology& topo, const WorkspaceConfig& cfg) {
    return fiar::strategy_thresholds(P::backend, topo, cfg);
  }
  // Collective: the group's id, the same on every rank (rank 0's random value), under which this rank claims the
  // streams it calls on (two ranks of the group on one stream throw instead of waiting for each other).
  template <Bootstrap B>
  void agree_group(B& boot) {
    const auto ids = all_gather_value(boot, detail::random_id());
    streams_.emplace(ids[0], this->topo_.rank);
  }
  // The record of bad MoE indices (host-visible: host memory the kernels also write), cleared.
  void allocate_index_error() {
    auto* e = static_cast<algo::MoeIndexError*>(this->platform_.allocate_host_visible(sizeof(algo::MoeIndexError)));
    exec::SystemAtomics::store_release(&e->claim, 0u);
    index_error_ = detail::Borrowed(e);
  }
  // Why the engines cannot exist in this build ("" when they can): nccl without NCCL on CudaPlatform.
  static std::string creation_error() { return kLamport ? std::string() : Nccl::creation_error(); }
  // Whether a call of max_token_num tokens reaches the route's threshold (only then is the route set up).
  static bool route_reached(const Topology& topo, const WorkspaceConfig& cfg) {
    return topo.world_size > 1 && thresholds(topo, cfg).nccl_min_bytes <= Nccl::max_bytes(cfg);
  }
  // The configuration checks ("" when it passes): every backend's, then the Lamport buffer's bound and the route a
  // caller asked for.
  static std::string config_error(const Topology& topo, const WorkspaceConfig& cfg) {
    if (std::string e = detail::common_config_error<T>(cfg); !e.empty()) return e;
    if constexpr (kLamport) {
      const std::string name(to_string(P::backend));
      if (cfg.nccl_min_bytes && route_reached(topo, cfg)) {
        if (std::string e = Nccl::creation_error(); !e.empty()) {
          return "fiar: WorkspaceConfig::nccl_min_bytes = " + std::to_string(*cfg.nccl_min_bytes) + " asks the " +
                 name + " workspace for its NCCL route, but " + detail::without_fiar_prefix(e) +
                 " Or leave nccl_min_bytes unset (or fiar::never): the calls then stay on fiar's kernels.";
        }
      }
      const std::size_t words = buffer_words(topo.world_size, topo.arch, cfg);
      if (words > std::numeric_limits<std::uint32_t>::max()) {
        return "fiar: the " + name + " workspace for max_token_num " + std::to_string(cfg.max_token_num) +
               ", hidden_dim " + std::to_string(cfg.hidden_dim) + " and world_size " + std::to_string(topo.world_size) +
               " needs " + std::to_string(words * 4) +
               " bytes per Lamport buffer; allowed: at most 16 GiB. Fix: lower max_token_num (or oneshot_max_bytes / "
               "oneshot_at_max_tokens).";
      }
    }
    return "";
  }
  // Collective: every rank checks and agrees (detail::agree_on_creation); the strategy table's row they agreed on.
  template <Bootstrap B, class CreationError>
  static StrategyThresholds agreed_thresholds(B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                                              CreationError&& creation_error) {
    auto extras = [&] {
      std::size_t words = 0;
      if constexpr (kLamport) {
        words = buffer_words(topo.world_size, topo.arch, cfg);
      } else {
        words = required_bytes(topo, cfg) / 4;  // what the NCCL engine allocates
      }
      return detail::CreationExtras{words, thresholds(topo, cfg), kLamport};
    };
    return detail::agree_on_creation<P, T>(
               boot, topo, cfg, [&] { return config_error(topo, cfg); }, creation_error, extras)
        .thresholds;
  }

  // A backend that runs but is expected to lose here (trtllm on a PCIe-only node of more than 2 ranks): one warning
  // for the group, from rank 0. Auto never picks one; an explicit request is honoured.
  static void warn_if_slow(const Topology& topo) {
    if (topo.rank != 0 || !slow_on(P::backend, topo)) return;
    log(LogLevel::Warning, "rank 0: " + expected_cost(P::backend, topo) + ". Fix: unset " +
                               std::string(backend_env_var) + " (auto) or set it to nccl.");
  }

  // Collective (before the Lamport region): the NCCL route when the largest call reaches its threshold. A route the
  // caller asked for (nccl_min_bytes given) that cannot be set up fails the creation on every rank; the table's own
  // is left out with one warning, and those calls take the Lamport strategies. A timeout (a rank missing) always
  // fails the creation.
  template <Bootstrap B>
  void create_route(B& boot) {
    const Topology& topo = this->topo_;
    const WorkspaceConfig& cfg = this->cfg_;
    const std::size_t from = this->thresholds_.nccl_min_bytes;
    this->route_ = false;
    if (!route_reached(topo, cfg)) {
      this->route_reason_ =
          topo.world_size == 1 ? std::string("a single rank has nothing to reduce")
          : from == never ? std::string("the strategy table has no NCCL step for this group (nccl_min_bytes never)")
                          : "no call reaches nccl_min_bytes = " + std::to_string(from) + " (the largest, " +
                                std::to_string(cfg.max_token_num) + " tokens, has " +
                                std::to_string(Nccl::max_bytes(cfg)) + " bytes)";
      return;
    }
    std::string failure = detail::without_fiar_prefix(Nccl::creation_error());
    if (failure.empty()) {
      try {
        nccl_.emplace(this->platform_, boot, topo, cfg, this->thresholds_.nccl_symmetric_max_bytes);
        this->route_ = true;
        return;
      } catch (const timeout_error&) {
        throw;
      } catch (const std::exception& e) {
        if (cfg.nccl_min_bytes) throw;
        failure = detail::without_fiar_prefix(e.what());
      }
    }
    this->route_reason_ = "setting it up failed: " + failure;
    if (topo.rank == 0) {
      log(LogLevel::Warning, "rank 0: the " + std::string(to_string(P::backend)) +
                                 " workspace's NCCL route (calls from " + std::to_string(from) +
                                 " bytes per rank) is off, those calls stay on fiar's kernels: " + this->route_reason_ +
                                 " Fix: that failure, or WorkspaceConfig::nccl_min_bytes = fiar::never to go "
                                 "without the route.");
    }
  }

  // Declared after the platform (in the base): destroyed before the memory they point into.
  std::optional<Lamport> lamport_;  ///< trtllm / mnnvl
  std::optional<Nccl> nccl_;        ///< nccl, or the NCCL route of trtllm / mnnvl
  detail::Borrowed<algo::MoeIndexError>
      index_error_;  ///< the platform's memory: where MoE finalize calls record a bad index
  std::optional<detail::StreamClaim> streams_;
  std::uint32_t moe_calls_ = 0;  ///< MoE finalize calls made (EpilogueParams::moe_call of the last)  ///< the stream
                                 ///< this rank calls on, known to the group's other ranks
};

/// What every workspace offers (Workspace<P, T, Platform> for each backend, and AnyWorkspace).
template <class W>
concept AllreduceWorkspace =
    requires(W& w, const W& cw, const FusedArgs<typename W::value_type>& a, const typename W::value_type* in,
             typename W::value_type* out, cudaStream_t s, int n, Strategy st) {
      typename W::value_type;
      typename W::platform_type;
      w.allreduce(in, out, n, s, st);
      w.template run<Pattern::ResidualRmsNorm>(a, s, st);
      cw.check();
      { cw.strategy_for(n) } -> std::same_as<Strategy>;
      { cw.last_strategy() } -> std::same_as<Strategy>;
      { cw.is_buffer_size_sufficient(n, st) } -> std::same_as<bool>;
      { cw.arch() } -> std::same_as<int>;
      { cw.topology() } -> std::same_as<const Topology&>;
      { cw.config() } -> std::same_as<const WorkspaceConfig&>;
    } &&
    std::move_constructible<W> && !std::copy_constructible<W>;

FIAR_END_NAMESPACE
