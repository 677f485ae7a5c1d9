// SPDX-License-Identifier: Apache-2.0
// fiar/backend/lamport.hpp — what the trtllm and mnnvl workspaces share: sizing, the strategy choice, the allocation
// of the Lamport region, the launch of the Lamport operations (algo/lamport.hpp) and the NCCL route (large calls
// handed to a nccl workspace of the same group, Strategy::Nccl).
// Contract: a kernel that waited past the deadline makes this and every later call throw fiar::timeout_error until
// the workspace is recreated. The backends differ only in how the region is mapped (peer mappings, or a multicast
// object as well) and in their operations (TrtllmOneShot ... MnnvlTwoShot), which Policy and the backend file choose.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../algo/epilogue.hpp"
#include "../algo/lamport.hpp"
#include "../algo/multimem.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/log.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../exec/vec.hpp"
#include "nccl.hpp"
#include "validate.hpp"
#include "workspace.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// The Lamport workspace of Policy (TrtllmPolicy or MnnvlPolicy), launching OneShot<P, T> and TwoShot<P, T>, and
/// (multicast only) InSwitch<P, T> for Strategy::Multimem.
template <class Policy, ReduceType T, class Pf, template <Pattern, class> class OneShot,
          template <Pattern, class> class TwoShot, template <Pattern, class> class InSwitch = OneShot>
class LamportWorkspace {
  static constexpr bool kMulticast = Policy::needs_multicast;
  static constexpr std::string_view kName = to_string(Policy::backend);

 public:
  /// Words of one Lamport buffer for this configuration (one of three; a call uses one), without the NCCL route
  /// (with it, the buffers hold only the calls below nccl_min_bytes: see lamport_tokens()).
  static std::size_t buffer_words(int world_size, int arch, const WorkspaceConfig& cfg) {
    return buffer_words_for(world_size, arch, cfg, cfg.max_token_num);
  }

  /// Words of one Lamport buffer whose calls have at most max_tokens tokens.
  static std::size_t buffer_words_for(int world_size, int arch, const WorkspaceConfig& cfg, int max_tokens) {
    const int vecs = vecs_per_token(cfg.hidden_dim);
    const std::size_t threshold = thresholds(Topology{.world_size = world_size, .arch = arch}, cfg).oneshot_max_bytes;
    const std::size_t row_bytes = static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
    // Auto runs one-shot up to the threshold and whenever tokens < world size (choose_strategy).
    const std::size_t auto_oneshot_tokens = std::max<std::size_t>(threshold / row_bytes, world_size - 1);
    const int oneshot_tokens = cfg.oneshot_at_max_tokens
                                   ? max_tokens
                                   : static_cast<int>(std::min<std::size_t>(auto_oneshot_tokens, max_tokens));
    return algo::header_words(world_size) + std::max(algo::oneshot_words(world_size, std::max(oneshot_tokens, 1), vecs),
                                                     algo::twoshot_words(world_size, max_tokens, vecs));
  }

  /// Bytes of rank-visible memory each rank allocates (three Lamport buffers; mnnvl: and the multimem barrier
  /// counters), without the NCCL route: with it, less (the buffers hold only the calls below nccl_min_bytes), plus
  /// the route's own (its sum buffer and window, and NCCL's).
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return (algo::kLamportBuffers * buffer_words(topo.world_size, topo.arch, cfg) + counter_words(cfg)) *
           sizeof(std::uint32_t);
  }

  static std::string config_error(const Topology& topo, const WorkspaceConfig& cfg) {
    if (std::string e = common_config_error<T>(cfg); !e.empty()) return e;
    if (cfg.nccl_min_bytes && route_reached(topo, cfg)) {
      if (std::string e = route_creation_error(); !e.empty()) {
        return "fiar: WorkspaceConfig::nccl_min_bytes = " + std::to_string(*cfg.nccl_min_bytes) + " asks the " +
               std::string(kName) + " workspace for its NCCL route, but " + without_fiar_prefix(e) +
               " Or leave nccl_min_bytes unset (or fiar::never): the calls then stay on fiar's kernels.";
      }
    }
    const std::size_t words = buffer_words(topo.world_size, topo.arch, cfg);
    if (words > std::numeric_limits<std::uint32_t>::max()) {
      return "fiar: the " + std::string(kName) + " workspace for max_token_num " + std::to_string(cfg.max_token_num) +
             ", hidden_dim " + std::to_string(cfg.hidden_dim) + " and world_size " + std::to_string(topo.world_size) +
             " needs " + std::to_string(words * 4) +
             " bytes per Lamport buffer; allowed: at most 16 GiB. Fix: lower max_token_num (or oneshot_max_bytes / "
             "oneshot_at_max_tokens).";
    }
    return "";
  }

  static CreationExtras creation_extras(const Topology& topo, const WorkspaceConfig& cfg) {
    return CreationExtras{buffer_words(topo.world_size, topo.arch, cfg), thresholds(topo, cfg), true};
  }

  /// Sets up the NCCL route when the largest call reaches it, then allocates and fills the Lamport region, once every
  /// rank agreed on `agreed` (Workspace's constructor). The route comes first: whether it exists (the same on every
  /// rank) decides how many tokens the Lamport buffers hold.
  template <Bootstrap B>
  LamportWorkspace(const CreationExtras& agreed, B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                   const typename Pf::Options& options)
      : platform_(options), topo_(topo), cfg_(cfg), thresholds_(agreed.thresholds), buffer_words_(agreed.buffer_words) {
    create_route(agreed, boot, options);
    if (route_) buffer_words_ = buffer_words_for(topo.world_size, topo.arch, cfg, lamport_tokens());
    const std::size_t lamport_words = algo::kLamportBuffers * buffer_words_;
    const std::size_t region_words = lamport_words + counter_words(cfg);
    if constexpr (kMulticast) {
      // Peer mappings for the two-shot scatter, plus the group's multicast mapping of the same memory. A failure here
      // (no multicast on this machine after all) throws fiar::multicast_error on every rank.
      auto region = platform_.allocate_multicast(boot, region_words * sizeof(std::uint32_t));
      buffers_ = std::move(region.peers);
      multicast_ = region.view;
    } else {
      buffers_ = platform_.allocate_shared(boot, region_words * sizeof(std::uint32_t));
    }
    state_ = Borrowed(static_cast<algo::LamportState*>(platform_.allocate_local(sizeof(algo::LamportState))));
    error_ = Borrowed(static_cast<algo::ErrorRecord*>(platform_.allocate_host_visible(sizeof(algo::ErrorRecord))));
    platform_.fill_words(buffers_[static_cast<std::size_t>(topo.rank)], lamport_words, exec::kSentinelWord);
    if constexpr (kMulticast) {
      platform_.fill_words(buffers_[static_cast<std::size_t>(topo.rank)] + lamport_words, counter_words(cfg), 0u);
      generations_ = Borrowed(static_cast<std::uint32_t*>(
          platform_.allocate_local(counter_words(cfg) * sizeof(std::uint32_t), "the multimem barrier generations")));
    }
    platform_.synchronize();
    boot.barrier();  // no rank pushes into a buffer before its owner has filled it with sentinels
  }

  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Pf& platform() { return platform_; }
  [[nodiscard]] int arch() const { return platform_.arch() != 0 ? platform_.arch() : topo_.arch; }
  [[nodiscard]] std::size_t oneshot_threshold() const { return thresholds_.oneshot_max_bytes; }
  [[nodiscard]] const StrategyThresholds& strategy_thresholds() const { return thresholds_; }
  [[nodiscard]] bool has_nccl_route() const { return route_.has_value(); }
  [[nodiscard]] const std::string& nccl_route_reason() const { return route_reason_; }
  /// The most tokens a call on the Lamport buffers can have: max_token_num, or with the route the largest call
  /// below nccl_min_bytes (larger ones are the route's).
  [[nodiscard]] int lamport_tokens() const {
    if (!route_) return cfg_.max_token_num;
    const std::size_t row = message_bytes(cfg_, 1), from = thresholds_.nccl_min_bytes;
    const std::size_t below = from <= row ? 1 : (from - 1) / row;
    return static_cast<int>(std::min<std::size_t>(std::max<std::size_t>(below, 1), cfg_.max_token_num));
  }
  [[nodiscard]] Strategy last_strategy() const { return last_strategy_; }

  [[nodiscard]] Strategy strategy_for(int num_tokens) const {
    return choose_strategy(thresholds_, topo_.world_size, num_tokens, message_bytes(cfg_, num_tokens), kMulticast,
                           route_.has_value());
  }

  /// Whether one call of num_tokens tokens with that strategy fits: one of the three Lamport buffers backs a call,
  /// so this is the real per-call capacity (not total bytes / row bytes).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s) const {
    if (num_tokens < 1 || num_tokens > cfg_.max_token_num || !is_valid(s)) return false;
    if (s == Strategy::Multimem && !kMulticast) return false;
    if (s == Strategy::Auto) s = strategy_for(num_tokens);
    if (s == Strategy::Nccl) return route_.has_value();  // the route's buffers hold max_token_num
    return words_for(s, num_tokens) <= data_words();
  }

  /// Why a forced strategy cannot run a call of num_tokens tokens ("" when it can; Auto always fits).
  [[nodiscard]] std::string strategy_error(int num_tokens, Strategy s) const {
    if (cfg_.batch_invariant && (s == Strategy::Multimem || s == Strategy::Nccl)) {
      return std::string(s == Strategy::Multimem ? "multimem (the in-switch reduction)"
                                                 : "strategy nccl (the NCCL route)") +
             " sums in an order that follows the message size, and this workspace was created with "
             "WorkspaceConfig::batch_invariant = true. Fix: use Strategy::Auto, OneShot or TwoShot, or create the "
             "workspace with batch_invariant = false.";
    }
    if (s == Strategy::Multimem && !kMulticast) {
      return "multimem (the in-switch reduction) needs NVLink multicast: it runs on the mnnvl backend only. Fix: use "
             "Strategy::Auto, OneShot or TwoShot on " +
             std::string(kName) + ", or the mnnvl backend.";
    }
    if (s == Strategy::Nccl && !route_) {
      return "strategy nccl needs the workspace's NCCL route, and this " + std::string(kName) +
             " workspace has none: " + route_reason_ +
             ". Fix: use Strategy::Auto, or create the workspace with WorkspaceConfig::nccl_min_bytes at most the "
             "bytes of its largest call (max_token_num x hidden_dim x sizeof(T) = " +
             std::to_string(message_bytes(cfg_, cfg_.max_token_num)) + ").";
    }
    if (s == Strategy::Auto || is_buffer_size_sufficient(num_tokens, s)) return "";
    if (route_ && num_tokens > lamport_tokens()) {
      return std::string(to_string(s)) + " with num_tokens = " + std::to_string(num_tokens) +
             ": calls from nccl_min_bytes = " + std::to_string(thresholds_.nccl_min_bytes) +
             " bytes per rank are the NCCL route's, and this workspace's Lamport buffers hold at most " +
             std::to_string(lamport_tokens()) +
             " tokens. Fix: use Strategy::Auto or Nccl, or create the workspace with a larger nccl_min_bytes (or "
             "fiar::never).";
    }
    return std::string(to_string(s)) + " with num_tokens = " + std::to_string(num_tokens) + " needs " +
           std::to_string(words_for(s, num_tokens) * 4) + " bytes per Lamport buffer; this workspace has " +
           std::to_string(data_words() * 4) +
           ". Fix: use Strategy::Auto, or create the workspace with oneshot_at_max_tokens.";
  }

  void begin_call(cudaStream_t) { check_lamport(); }

  /// Launches the call (validated by Workspace::run).
  template <Pattern P>
  void launch(const FusedArgs<T>& a, cudaStream_t stream, Strategy strategy) {
    const Strategy s = strategy == Strategy::Auto ? strategy_for(a.num_tokens) : strategy;
    if (s == Strategy::Nccl) {
      // The route's own checks and digests (strategy_error refused Nccl without a route). The Lamport buffers are
      // untouched: every rank skips them alike, so the next Lamport call finds them as the last one left them.
      route_->begin_call(stream);
      route_->template launch<P>(a, stream, Strategy::Auto);
      last_strategy_ = s;
      return;
    }
    algo::LamportParams<T> p{};
    p.in = a.in;
    p.out = a.out;
    p.num_tokens = a.num_tokens;
    p.vecs_per_token = vecs_per_token(cfg_.hidden_dim);
    p.world_size = topo_.world_size;
    p.rank = topo_.rank;
    for (int r = 0; r < topo_.world_size; ++r) p.buffers[r] = buffers_[static_cast<std::size_t>(r)];
    p.multicast = multicast_;
    p.buffer_words = buffer_words_;
    p.state = state_.get();
    p.error = error_.get();
    p.timeout_ns =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.timeout).count());
    p.verify = cfg_.verify_calls;
    p.epi = algo::epilogue_params(a, cfg_.hidden_dim);
    if (s == Strategy::Multimem) {
      // Only mnnvl gets here: Workspace::run rejects Multimem elsewhere (strategy_error).
      if constexpr (kMulticast) {
        platform_.template launch<InSwitch<P, T>>(
            algo::MultimemParams<T>{p, algo::kLamportBuffers * buffer_words_, generations_.get()}, stream);
      } else {
        throw std::logic_error("fiar: unreachable: Strategy::Multimem reached a workspace without multicast");
      }
    } else if (s == Strategy::TwoShot) {
      platform_.template launch<TwoShot<P, T>>(p, stream);
    } else {
      platform_.template launch<OneShot<P, T>>(p, stream);
    }
    last_strategy_ = s;
    if constexpr (Pf::synchronous) check();
  }

  /// Throws fiar::mismatch_error if a call of this workspace saw a peer's call digest differ from its own, and
  /// fiar::timeout_error if a kernel gave up waiting (then every later call throws too: the protocol state is lost;
  /// recreate the workspace on every rank); the NCCL route's failures likewise.
  void check() const {
    check_lamport();
    if (route_) route_->check();
  }

  /// Test hook (Workspace::testing_set_call_counter): the protocol's call counter, as if `call` calls had completed;
  /// the buffer rotation goes on where it is. Every rank sets the same value between two calls.
  void set_call_counter(std::uint32_t call) {
    platform_.synchronize();
    platform_.fill_words(&state_->call, 1, call);
    platform_.synchronize();
    if (route_) route_->set_call_counter(call);
  }

 private:
  using Route = NcclWorkspace<T, Pf>;

  // The Lamport side of check().
  void check_lamport() const {
    if (!error_) throw std::logic_error(moved_from_text("workspace"));
    const std::uint32_t code = Pf::read_word(&error_->code);
    if (code == algo::kErrorNone) return;
    if ((code & algo::kErrorMismatch) != 0) {
      auto digest = [](const std::uint32_t* w) {
        return algo::CallDigest{Pf::read_word(w), Pf::read_word(w + 1), Pf::read_word(w + 2), Pf::read_word(w + 3)};
      };
      throw mismatch_error(call_mismatch_text(kName, topo_.rank, digest(error_->mine),
                                              static_cast<int>(Pf::read_word(&error_->peer)), digest(error_->theirs)));
    }
    auto mask = [](const std::uint32_t* words) {
      return std::uint64_t{Pf::read_word(words)} | (std::uint64_t{Pf::read_word(words + 1)} << 32);
    };
    const std::uint64_t missing = mask(error_->missing);
    const std::uint64_t stalled = mask(error_->stalled);
    if ((code & algo::kErrorBarrier) != 0 && missing == 0 && stalled == 0) {
      throw timeout_error(call_timeout_text(
          kName, topo_.rank, cfg_.timeout,
          "at a barrier of the in-switch reduction (multimem): another rank's blocks never arrived (the barrier counts "
          "arrivals, so it cannot name the rank; the other ranks' errors can)",
          Pf::read_word(&error_->call)));
    }
    const std::string waited = missing != 0
                                   ? "waiting for data from rank(s) " + rank_mask_text(missing)
                                   : "waiting for results reduced by rank(s) " + rank_mask_text(stalled) +
                                         " (two-shot owners: one of them, or a rank they wait for, is missing)";
    throw timeout_error(call_timeout_text(kName, topo_.rank, cfg_.timeout, waited, Pf::read_word(&error_->call)));
  }

  // The multimem barrier counters after the Lamport buffers, one per token (mnnvl only).
  static std::size_t counter_words(const WorkspaceConfig& cfg) {
    return kMulticast ? static_cast<std::size_t>(std::max(cfg.max_token_num, 1)) : 0;
  }

  static int vecs_per_token(int hidden_dim) {
    return static_cast<int>(static_cast<std::size_t>(hidden_dim) * sizeof(T) / 16);
  }
  static StrategyThresholds thresholds(const Topology& topo, const WorkspaceConfig& cfg) {
    return fiar::strategy_thresholds(Policy::backend, topo, cfg);
  }
  static std::size_t message_bytes(const WorkspaceConfig& cfg, int num_tokens) {
    return static_cast<std::size_t>(num_tokens) * static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
  }
  // Why the route cannot exist in this build ("" when it can; the host emulator's always can).
  static std::string route_creation_error() {
    if constexpr (requires { Route::creation_error(); }) {
      return Route::creation_error();
    } else {
      return "";
    }
  }
  // Whether a call of max_token_num tokens reaches the route's threshold (only then is the route set up).
  static bool route_reached(const Topology& topo, const WorkspaceConfig& cfg) {
    return topo.world_size > 1 && thresholds(topo, cfg).nccl_min_bytes <= message_bytes(cfg, cfg.max_token_num);
  }

  // Collective (before the Lamport region): the NCCL route when the largest call reaches its threshold. A route the
  // caller asked for (nccl_min_bytes given) that cannot be set up fails the creation on every rank; the table's own
  // is left out with one warning, and those calls take the Lamport strategies. A timeout (a rank missing) always
  // fails the creation.
  template <Bootstrap B>
  void create_route(const CreationExtras& agreed, B& boot, const typename Pf::Options& options) {
    const std::size_t from = thresholds_.nccl_min_bytes;
    if (!route_reached(topo_, cfg_)) {
      route_reason_ = topo_.world_size == 1 ? std::string("a single rank has nothing to reduce")
                      : from == never
                          ? std::string("the strategy table has no NCCL step for this group (nccl_min_bytes never)")
                          : "no call reaches nccl_min_bytes = " + std::to_string(from) + " (the largest, " +
                                std::to_string(cfg_.max_token_num) + " tokens, has " +
                                std::to_string(message_bytes(cfg_, cfg_.max_token_num)) + " bytes)";
      return;
    }
    std::string failure = without_fiar_prefix(route_creation_error());
    if (failure.empty()) {
      try {
        route_.emplace(agreed, boot, topo_, cfg_, options);
        return;
      } catch (const timeout_error&) {
        throw;
      } catch (const std::exception& e) {
        if (cfg_.nccl_min_bytes) throw;
        failure = without_fiar_prefix(e.what());
      }
    }
    route_reason_ = "setting it up failed: " + failure;
    if (topo_.rank == 0) {
      log(LogLevel::Warning, "rank 0: the " + std::string(kName) + " workspace's NCCL route (calls from " +
                                 std::to_string(from) +
                                 " bytes per rank) is off, those calls stay on fiar's kernels: " + route_reason_ +
                                 " Fix: that failure, or WorkspaceConfig::nccl_min_bytes = fiar::never to go "
                                 "without the route.");
    }
  }
  // Words of one buffer for data, after its header of call digests.
  std::size_t data_words() const { return buffer_words_ - algo::header_words(topo_.world_size); }
  // Data words of one call.
  std::size_t words_for(Strategy s, int num_tokens) const {
    const int vecs = vecs_per_token(cfg_.hidden_dim);
    if (s == Strategy::Multimem) return algo::multimem_words(num_tokens, vecs);
    return s == Strategy::TwoShot ? algo::twoshot_words(topo_.world_size, num_tokens, vecs)
                                  : algo::oneshot_words(topo_.world_size, num_tokens, vecs);
  }

  Pf platform_;
  Topology topo_;
  WorkspaceConfig cfg_;
  StrategyThresholds thresholds_;
  std::size_t buffer_words_ = 0;
  std::vector<std::uint32_t*> buffers_;
  exec::MulticastView multicast_{};
  Borrowed<algo::LamportState> state_;
  Borrowed<algo::ErrorRecord> error_;    ///< null once moved from
  Borrowed<std::uint32_t> generations_;  ///< mnnvl: each multimem barrier counter's value after its last call
  Strategy last_strategy_ = Strategy::Auto;
  std::optional<Route> route_;  ///< the NCCL route (Strategy::Nccl); destroyed before the Lamport region
  std::string route_reason_;    ///< why there is no route ("" when there is one)
};

}  // namespace detail
FIAR_END_NAMESPACE
