// SPDX-License-Identifier: Apache-2.0
// fiar/backend/workspace.hpp — Workspace<P, T, Platform>: the all-reduce workspace of one backend and one element type,
// its interface written once for every backend, and what a backend plugs into it.
// Contract: Workspace exists only for an AllreducePolicy P, a ReduceType T and a Platform; naming it with anything
// else is a compile error naming the unmet concept. Creation is collective and verified through comm/agree.hpp (every
// rank agrees on the configuration or every rank throws the same error, before anything is allocated); every call is
// validated (backend/validate.hpp) before anything is launched.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "../algo/lamport.hpp"
#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/log.hpp"
#include "../core/pattern.hpp"
#include "../core/policy.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../core/version.hpp"
#include "../platform/concept.hpp"
#include "../platform/cuda.hpp"
#include "../runtime/nccl.hpp"
#include "validate.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// The configuration as ranks compare it: at creation (with the strategy thresholds the backend resolved, those it
/// does not apply left out) and in WorkspacePool requests (the thresholds as given).
struct ConfigDigest {
  std::uint64_t oneshot_max_bytes = 0;  ///< meaningful when threshold_given
  std::int64_t timeout_ms = 0;
  std::int32_t max_token_num = 0;
  std::int32_t hidden_dim = 0;
  std::uint32_t threshold_given = 0;
  std::uint32_t oneshot_at_max_tokens = 0;
  std::uint32_t verify_calls = 0;
  std::uint32_t multimem_given = 0;
  std::uint64_t multimem_min_bytes = 0;  ///< meaningful when multimem_given
  std::uint32_t nccl_given = 0;
  std::uint32_t symmetric_given = 0;
  std::uint64_t nccl_min_bytes = 0;            ///< meaningful when nccl_given
  std::uint64_t nccl_symmetric_max_bytes = 0;  ///< meaningful when symmetric_given
  std::uint32_t batch_invariant = 0;

  static ConfigDigest of(const WorkspaceConfig& c) {
    ConfigDigest d;
    d.oneshot_max_bytes = c.oneshot_max_bytes.value_or(0);
    d.timeout_ms = static_cast<std::int64_t>(c.timeout.count());
    d.max_token_num = c.max_token_num;
    d.hidden_dim = c.hidden_dim;
    d.threshold_given = c.oneshot_max_bytes ? 1u : 0u;
    d.oneshot_at_max_tokens = c.oneshot_at_max_tokens ? 1u : 0u;
    d.verify_calls = c.verify_calls ? 1u : 0u;
    d.multimem_given = c.multimem_min_bytes ? 1u : 0u;
    d.multimem_min_bytes = c.multimem_min_bytes.value_or(0);
    d.nccl_given = c.nccl_min_bytes ? 1u : 0u;
    d.nccl_min_bytes = c.nccl_min_bytes.value_or(0);
    d.symmetric_given = c.nccl_symmetric_max_bytes ? 1u : 0u;
    d.nccl_symmetric_max_bytes = c.nccl_symmetric_max_bytes.value_or(0);
    d.batch_invariant = c.batch_invariant ? 1u : 0u;
    return d;
  }
  /// The thresholds a backend resolved in place of those given; `lamport`: whether it has the Lamport strategies
  /// (and the route), else only the symmetric window's bound applies and the rest is left out of the comparison.
  void resolve(const StrategyThresholds& t, bool lamport) {
    symmetric_given = 1;
    nccl_symmetric_max_bytes = t.nccl_symmetric_max_bytes;
    if (lamport) {
      // A step that is never taken is left out (and compared as absent): the same behaviour, the same record.
      threshold_given = 1;
      oneshot_max_bytes = t.oneshot_max_bytes;
      multimem_given = t.multimem_min_bytes != never ? 1u : 0u;
      multimem_min_bytes = multimem_given ? t.multimem_min_bytes : 0;
      nccl_given = t.nccl_min_bytes != never ? 1u : 0u;
      nccl_min_bytes = nccl_given ? t.nccl_min_bytes : 0;
    } else {
      threshold_given = multimem_given = nccl_given = oneshot_at_max_tokens = 0;
      oneshot_max_bytes = multimem_min_bytes = nccl_min_bytes = 0;
    }
  }
  friend bool operator==(const ConfigDigest&, const ConfigDigest&) = default;

  /// "max_token_num 16, hidden_dim 64, timeout 30000 ms, oneshot_max_bytes default, oneshot_at_max_tokens false,
  /// verify_calls true" (and each other threshold that is given or resolved).
  [[nodiscard]] std::string describe() const {
    auto bytes = [](const char* name, std::uint32_t given, std::uint64_t value) {
      if (given == 0) return std::string();
      return ", " + std::string(name) + " " + (value == never ? std::string("never") : std::to_string(value));
    };
    return "max_token_num " + std::to_string(max_token_num) + ", hidden_dim " + std::to_string(hidden_dim) +
           ", timeout " + std::to_string(timeout_ms) + " ms, oneshot_max_bytes " +
           (threshold_given ? std::to_string(oneshot_max_bytes) : std::string("default")) + ", oneshot_at_max_tokens " +
           (oneshot_at_max_tokens ? "true" : "false") + ", verify_calls " + (verify_calls ? "true" : "false") +
           bytes("multimem_min_bytes", multimem_given, multimem_min_bytes) +
           bytes("nccl_min_bytes", nccl_given, nccl_min_bytes) +
           bytes("nccl_symmetric_max_bytes", symmetric_given, nccl_symmetric_max_bytes) +
           (batch_invariant != 0 ? ", batch_invariant true" : "");
  }
};

/// What a backend adds to the creation digest: its strategy thresholds as it resolved them, and its buffer size.
struct CreationExtras {
  std::uint64_t buffer_words = 0;
  StrategyThresholds thresholds{};  ///< resolved (strategy_thresholds)
  bool strategies = false;          ///< whether the Lamport strategies (and the route) apply
};

/// What every rank exchanges at creation.
struct CreationRecord {
  std::uint32_t backend, dtype, world_size, version_major, version_minor, version_patch;
  ConfigDigest config;
  std::uint64_t buffer_words;

  friend bool operator==(const CreationRecord&, const CreationRecord&) = default;
  [[nodiscard]] std::string describe() const {
    return "backend " + std::string(to_string(static_cast<Backend>(backend))) + ", dtype " +
           std::string(dtype_name(dtype)) + ", world_size " + std::to_string(world_size) + ", " + config.describe() +
           ", fiar " + std::to_string(version_major) + "." + std::to_string(version_minor) + "." +
           std::to_string(version_patch);
  }
};

/// Collective: every rank checks the topology, its match with the bootstrap and the configuration (config_error(),
/// then creation_error(), both "" when fine; each called only when what comes before passed), then all agree: either
/// every rank returns the agreed extras, or every rank throws the same std::invalid_argument (a rank's objection, or
/// configurations that differ).
template <class Policy, ReduceType T, Bootstrap B, class ConfigError, class CreationError, class Extras>
CreationExtras agree_on_creation(B& boot, const Topology& topo, const WorkspaceConfig& cfg, ConfigError&& config_error,
                                 CreationError&& creation_error, Extras&& extras) {
  std::string error = local_creation_error<Policy>(topo, boot, config_error);
  if (error.empty()) error = creation_error();
  const CreationExtras mine = error.empty() ? extras() : CreationExtras{};
  CreationRecord record{static_cast<std::uint32_t>(Policy::backend),
                        dtype_code<T>(),
                        static_cast<std::uint32_t>(topo.world_size),
                        version_major,
                        version_minor,
                        version_patch,
                        ConfigDigest::of(cfg),
                        mine.buffer_words};
  // The thresholds as resolved (a backend's values, not the defaults' absence), those it does not apply left out so
  // they cannot cause a mismatch; nothing to resolve when this rank objected (its record is not compared then).
  if (error.empty()) record.config.resolve(mine.thresholds, mine.strategies);
  const auto all = agree(boot, outcome_of(error), record, "workspace creation failed because rank {rank} rejected it");
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!(all[r] == all[0])) {
      throw std::invalid_argument("fiar: workspace configurations differ between ranks: rank 0 has {" +
                                  all[0].describe() + "}, rank " + std::to_string(r) + " has {" + all[r].describe() +
                                  "}. Fix: create the workspace with the same type, topology and WorkspaceConfig on "
                                  "every rank, with the same fiar version.");
    }
  }
  return mine;
}

/// "fiar: <backend> all-reduce on rank <r> gave up after <t> ms <waited> (call <c>): ...": a call that waited past its
/// deadline, on any backend.
inline std::string call_timeout_text(std::string_view backend, int rank, std::chrono::milliseconds timeout,
                                     const std::string& waited, std::uint64_t call) {
  return "fiar: " + std::string(backend) + " all-reduce on rank " + std::to_string(rank) + " gave up after " +
         std::to_string(timeout.count()) + " ms " + waited + " (call " + std::to_string(call) +
         "): a rank crashed, hung, or launched a different sequence of collectives. Fix: find that rank's failure; "
         "the workspace is unusable now, so recreate it on every rank.";
}

/// A call digest as the error message shows it: "call 3, num_tokens 8, pattern allreduce, strategy oneshot" (strategy
/// "auto" for a backend without strategies of its own, which sends 0).
inline std::string call_digest_text(const algo::CallDigest& d) {
  const auto pat = static_cast<Pattern>(d.pattern);
  const std::string pattern_name =
      is_valid(pat) ? std::string(to_string(pat)) : "pattern value " + std::to_string(d.pattern);
  const char* strategy_name = d.strategy == algo::kDigestOneShot    ? "oneshot"
                              : d.strategy == algo::kDigestTwoShot  ? "twoshot"
                              : d.strategy == algo::kDigestMultimem ? "multimem"
                                                                    : "auto";
  return "call " + std::to_string(d.call) + ", num_tokens " + std::to_string(d.num_tokens) + ", pattern " +
         pattern_name + ", strategy " + strategy_name;
}

/// "fiar: <backend> all-reduce on rank <r> ... does not match rank <p>'s ...": ranks that made different calls.
inline std::string call_mismatch_text(std::string_view backend, int rank, const algo::CallDigest& mine, int peer,
                                      const algo::CallDigest& theirs) {
  return "fiar: " + std::string(backend) + " all-reduce on rank " + std::to_string(rank) + " was called with {" +
         call_digest_text(mine) + "} but rank " + std::to_string(peer) + " with {" + call_digest_text(theirs) +
         "}; nothing reduced from the two was returned. Every rank of the group must make the same sequence of calls "
         "with the same num_tokens, pattern and strategy. Fix: make the ranks agree (e.g. pad the batch to the same "
         "num_tokens on every rank); the workspace is unusable now, so recreate it on every rank.";
}

/// The implementation of backend P's workspace: each backend specializes it (backend/<name>.hpp) with
/// `template <ReduceType T, class Platform> using type = ...;`.
template <class P>
struct BackendImpl;

/// What a backend's implementation provides to Workspace<P, T, Platform>.
template <class I, class T>
concept WorkspaceImpl = requires(I& i, const I& ci, const Topology& topo, const WorkspaceConfig& cfg,
                                 const FusedArgs<T>& a, cudaStream_t stream, Strategy s, int n) {
  { I::config_error(topo, cfg) } -> std::same_as<std::string>;
  { I::required_bytes(topo, cfg) } -> std::same_as<std::size_t>;
  { I::creation_extras(topo, cfg) } -> std::same_as<CreationExtras>;
  { ci.topology() } -> std::same_as<const Topology&>;
  { ci.config() } -> std::same_as<const WorkspaceConfig&>;
  { ci.arch() } -> std::same_as<int>;
  { ci.strategy_for(n) } -> std::same_as<Strategy>;
  { ci.last_strategy() } -> std::same_as<Strategy>;
  { ci.strategy_thresholds() } -> std::same_as<const StrategyThresholds&>;
  { ci.has_nccl_route() } -> std::same_as<bool>;
  { ci.nccl_route_reason() } -> std::same_as<const std::string&>;
  { ci.is_buffer_size_sufficient(n, s) } -> std::same_as<bool>;
  { ci.strategy_error(n, s) } -> std::same_as<std::string>;
  ci.check();
  i.begin_call(stream);
  i.template launch<Pattern::AllReduce>(a, stream, s);
};

}  // namespace detail

/// The per-group buffers and protocol state of backend P for element type T, on Platform (CudaPlatform: GPUs;
/// HostPlatform: the host emulator). Move-only. Its members are declared here, once for every backend, so
/// `template class Workspace<P, T, Platform>;` emits them.
template <AllreducePolicy P, ReduceType T, Platform Pf = CudaPlatform>
class Workspace {
  using Impl = typename detail::BackendImpl<P>::template type<T, Pf>;
  static_assert(detail::WorkspaceImpl<Impl, T>, "a backend's implementation must provide detail::WorkspaceImpl");
  static constexpr bool kLamport = requires { Impl::buffer_words(1, 0, WorkspaceConfig{}); };
  static constexpr bool kAdopts = requires(NcclComm c, const Topology& t) { Impl::adopt_error(c, t); };

 public:
  using policy_type = P;
  using value_type = T;
  using platform_type = Pf;

  /// Bytes of memory each rank allocates for this configuration (see docs/api.md per backend).
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return Impl::required_bytes(topo, cfg);
  }
  /// "" when this backend can serve the configuration on the topology, else the error creation would throw.
  static std::string why_not(const Topology& topo, const WorkspaceConfig& cfg) {
    // The topology first (check_topology validates it too): the configuration checks size buffers from it.
    if (std::string e = detail::topology_error<P>(topo); !e.empty()) return e;
    return Impl::config_error(topo, cfg);
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
  /// Words of one Lamport buffer for this configuration (one of three; a call uses one). Lamport backends only.
  static std::size_t buffer_words(int world_size, int arch, const WorkspaceConfig& cfg)
    requires kLamport
  {
    return Impl::buffer_words(world_size, arch, cfg);
  }

  /// Collective: every rank of the group constructs its workspace with the same topology (bar rank) and
  /// configuration. Throws std::invalid_argument (on every rank alike) when the topology or configuration cannot
  /// work, before allocating anything; allocation and mapping failures on every rank alike too; fiar::timeout_error
  /// when a rank does not arrive. nccl on CudaPlatform creates (and owns) an NCCL communicator, and so do trtllm and
  /// mnnvl for their NCCL route when the largest call reaches the strategy table's nccl_min_bytes.
  template <Bootstrap B>
  Workspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg, const typename Pf::Options& options = {})
      : impl_(detail::agree_on_creation<P, T>(
                  boot, topo, cfg, [&] { return Impl::config_error(topo, cfg); }, [] { return creation_error(); },
                  [&] { return Impl::creation_extras(topo, cfg); }),
              boot, topo, cfg, options) {
    warn_if_slow(topo);
  }

  /// Collective: adopts `comm`, an initialized NCCL communicator of exactly this group (same size, same rank
  /// numbers as the bootstrap, on the calling thread's current device). It is not owned: destroy it after this
  /// workspace. nccl on CudaPlatform only.
  template <Bootstrap B>
    requires kAdopts
  Workspace(B& boot, NcclComm comm, const Topology& topo, const WorkspaceConfig& cfg,
            const typename Pf::Options& options = {})
      : impl_(detail::agree_on_creation<P, T>(
                  boot, topo, cfg, [&] { return Impl::config_error(topo, cfg); },
                  [&] { return Impl::adopt_error(comm, topo); }, [&] { return Impl::creation_extras(topo, cfg); }),
              boot, comm, topo, cfg, options) {
    warn_if_slow(topo);
  }

  Workspace(Workspace&&) noexcept = default;

 private:
  // A backend that runs but is expected to lose here (trtllm on a PCIe-only node of more than 2 ranks): one warning
  // for the group, from rank 0. Auto never picks one; an explicit request is honoured.
  static void warn_if_slow(const Topology& topo) {
    if (topo.rank != 0 || !slow_on(P::backend, topo)) return;
    log(LogLevel::Warning, "rank 0: " + expected_cost(P::backend, topo) + ". Fix: unset " +
                               std::string(backend_env_var) + " (auto) or set it to nccl.");
  }

 public:
  /// Releases this workspace first, in the order its destructor does (nccl: the communicator before the memory it
  /// may still use), then takes `other`'s; assigning a workspace to itself changes nothing.
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      std::destroy_at(&impl_);
      std::construct_at(&impl_, std::move(other.impl_));
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
    impl_.begin_call(stream);
    const Topology& topo = impl_.topology();
    detail::validate_call_basics(topo.rank, Q, strategy, a.in, a.out, a.num_tokens, impl_.config().max_token_num);
    if (std::string e = impl_.strategy_error(a.num_tokens, strategy); !e.empty()) {
      throw std::invalid_argument(detail::call_where(Q, topo.rank) + e);
    }
    detail::validate_fused<Q, T>(a, impl_.config().hidden_dim, impl_.arch(), topo.rank, impl_.platform());
    impl_.template launch<Q>(a, stream, strategy);
  }

  /// Throws fiar::timeout_error once a call of this workspace gave up waiting for a peer (then on every later call:
  /// recreate the workspace on every rank); nccl on CudaPlatform also fiar::cuda_error for an asynchronous NCCL
  /// error; std::logic_error on a moved-from workspace.
  void check() const { impl_.check(); }

  /// Test hook, not for production: numbers this rank's next call `call` (the protocol's counter wraps at 2^32, every
  /// ~5-8 days of serving). Every rank of the group sets the same value once all have finished their previous call (a
  /// barrier before), and they meet again (a barrier) before the next call. Lets a test cross the wrap without 2^32
  /// calls.
  void testing_set_call_counter(std::uint32_t call) { impl_.set_call_counter(call); }

  /// The strategy Strategy::Auto takes for a call of num_tokens tokens (the same on every rank; Auto on nccl).
  [[nodiscard]] Strategy strategy_for(int num_tokens) const { return impl_.strategy_for(num_tokens); }
  /// The strategy the last call ran.
  [[nodiscard]] Strategy last_strategy() const { return impl_.last_strategy(); }
  /// Whether one call of num_tokens tokens with strategy s fits (the real per-call capacity).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    return impl_.is_buffer_size_sufficient(num_tokens, s);
  }
  /// The per-rank message bytes up to which Strategy::Auto takes one-shot. Lamport backends only.
  [[nodiscard]] std::size_t oneshot_threshold() const
    requires kLamport
  {
    return impl_.oneshot_threshold();
  }
  /// The row of the strategy table this workspace resolved at creation (the same on every rank): where
  /// Strategy::Auto changes path. The nccl backend applies only nccl_symmetric_max_bytes (its other fields are 0 or
  /// fiar::never).
  [[nodiscard]] const StrategyThresholds& strategy_thresholds() const { return impl_.strategy_thresholds(); }
  /// Whether Strategy::Nccl can run: trtllm / mnnvl when creation set up the NCCL route (a call of max_token_num
  /// tokens reaches nccl_min_bytes and the route could be set up); always on the nccl backend.
  [[nodiscard]] bool has_nccl_route() const { return impl_.has_nccl_route(); }
  /// Why there is no NCCL route ("" when there is one).
  [[nodiscard]] const std::string& nccl_route_reason() const { return impl_.nccl_route_reason(); }
  /// The architecture the kernels run on: the GPU's on CudaPlatform, the topology's on the host emulator.
  [[nodiscard]] int arch() const { return impl_.arch(); }
  [[nodiscard]] const Topology& topology() const { return impl_.topology(); }
  [[nodiscard]] const WorkspaceConfig& config() const { return impl_.config(); }
  [[nodiscard]] Pf& platform() { return impl_.platform(); }

  /// The communicator the calls run on (owned or adopted; null after a timeout aborted it). nccl on CudaPlatform.
  [[nodiscard]] NcclComm comm() const
    requires kAdopts
  {
    return impl_.comm();
  }
  /// Whether the workspace created (and destroys) its communicator. nccl on CudaPlatform.
  [[nodiscard]] bool owns_comm() const
    requires kAdopts
  {
    return impl_.owns_comm();
  }
  /// Whether the calls run on NCCL's symmetric kernels (a symmetric window registered at creation: NCCL 2.27+, an
  /// owned communicator, FIAR_NCCL_SYMMETRIC not 0). nccl on CudaPlatform.
  [[nodiscard]] bool nccl_symmetric() const
    requires kAdopts
  {
    return impl_.symmetric();
  }
  /// Why the calls take classic ncclAllReduce ("" when nccl_symmetric()). nccl on CudaPlatform.
  [[nodiscard]] const std::string& nccl_classic_reason() const
    requires kAdopts
  {
    return impl_.classic_reason();
  }

 private:
  static std::string creation_error() {
    if constexpr (requires { Impl::creation_error(); }) {
      return Impl::creation_error();
    } else {
      return "";
    }
  }

  Impl impl_;
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
