// SPDX-License-Identifier: Apache-2.0
// fiar/backend/any.hpp — make_workspace(): the run-time backend choice, agreed by every rank, and
// AnyWorkspace<T, Platform>, the workspace of whichever backend was chosen.
// Contract: make_workspace is collective. Every rank ends with the same backend: the ranks exchange what they
// requested and what they know of the topology (comm/agree.hpp), and resolve the backend on the combined facts. A
// rank-local mistake (a malformed topology, a bad Backend value, a bad FIAR_ALLREDUCE_BACKEND) and an explicit request
// that cannot run throw std::invalid_argument on every rank before anything is allocated; an explicit request is
// never replaced by another backend. Auto falls back only where the chosen policy names a fallback (mnnvl: trtllm),
// the resolution allows it, and the setup failed with fiar::multicast_error, with one warning for the group (logged by
// rank 0, core/log.hpp); at info, rank 0 also logs the choice and its reasons, once per workspace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/backend.hpp"
#include "../core/errors.hpp"
#include "../core/log.hpp"
#include "../core/policy.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../core/type_list.hpp"
#include "../platform/concept.hpp"
#include "registry.hpp"
#include "workspace.hpp"

FIAR_BEGIN_NAMESPACE

/// The workspace make_workspace() created: one of the backends' workspaces (one alternative per entry of
/// BackendPolicies), chosen at run time. Move-only; the queries are answered by the part every backend's workspace
/// shares (detail::WorkspaceCore), the calls by the backend's workspace.
template <ReduceType T, Platform Pf = CudaPlatform>
class AnyWorkspace {
  template <class... Ps>
  using VariantOf = std::variant<Workspace<Ps, T, Pf>...>;
  using Variant = apply_t<BackendPolicies, VariantOf>;

 public:
  using value_type = T;
  using platform_type = Pf;
  using Trtllm = Workspace<TrtllmPolicy, T, Pf>;
  using Mnnvl = Workspace<MnnvlPolicy, T, Pf>;
  using Nccl = Workspace<NcclPolicy, T, Pf>;

  template <class W>
    requires(std::is_same_v<std::remove_cvref_t<W>, Workspace<typename std::remove_cvref_t<W>::policy_type, T, Pf>> &&
             !std::is_lvalue_reference_v<W>)
  AnyWorkspace(W&& ws, Resolution resolution, bool fell_back)
      : ws_(std::in_place_type<std::remove_cvref_t<W>>, std::move(ws)),
        resolution_(resolution),
        fell_back_(fell_back) {}

  AnyWorkspace(AnyWorkspace&&) noexcept = default;
  AnyWorkspace& operator=(AnyWorkspace&&) noexcept = default;

  /// The backend that runs the calls (trtllm after a fallback).
  [[nodiscard]] Backend backend() const {
    return std::visit([](const auto& ws) { return std::decay_t<decltype(ws)>::policy_type::backend; }, ws_);
  }
  /// What resolve_backend chose on the group's combined topology (mnnvl when Auto fell back to trtllm).
  [[nodiscard]] Resolution resolution() const { return resolution_; }
  /// True when Auto chose mnnvl, multicast setup failed, and trtllm runs instead.
  [[nodiscard]] bool fell_back() const { return fell_back_; }

  /// The concrete workspace when the backend is P's, else nullptr.
  template <AllreducePolicy P>
  [[nodiscard]] Workspace<P, T, Pf>* get_if() {
    return std::get_if<Workspace<P, T, Pf>>(&ws_);
  }

  [[nodiscard]] const Topology& topology() const { return core().topology(); }
  [[nodiscard]] const WorkspaceConfig& config() const { return core().config(); }
  [[nodiscard]] int arch() const { return core().arch(); }
  [[nodiscard]] Strategy strategy_for(int num_tokens) const { return core().strategy_for(num_tokens); }
  [[nodiscard]] Strategy last_strategy() const { return core().last_strategy(); }
  /// Whether one call of num_tokens tokens with strategy s fits this workspace (the real per-call capacity).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    return core().is_buffer_size_sufficient(num_tokens, s);
  }
  /// The strategy table's row the workspace resolved (Workspace::strategy_thresholds).
  [[nodiscard]] const StrategyThresholds& strategy_thresholds() const { return core().strategy_thresholds(); }
  /// Whether Strategy::Nccl can run (Workspace::has_nccl_route), and why not.
  [[nodiscard]] bool has_nccl_route() const { return core().has_nccl_route(); }
  [[nodiscard]] const std::string& nccl_route_reason() const { return core().nccl_route_reason(); }
  /// The platform the workspace runs on (its memory, its launches).
  [[nodiscard]] Pf& platform() {
    return std::visit([](auto& ws) -> Pf& { return ws.platform(); }, ws_);
  }

  void allreduce(const T* in, T* out, int num_tokens, cudaStream_t stream = nullptr,
                 Strategy strategy = Strategy::Auto) {
    std::visit([&](auto& ws) { ws.allreduce(in, out, num_tokens, stream, strategy); }, ws_);
  }
  template <Pattern P>
  void run(const FusedArgs<T>& a, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    std::visit([&](auto& ws) { ws.template run<P>(a, stream, strategy); }, ws_);
  }
  /// The all-reduce fused with the user epilogue E (Workspace::run<E>).
  template <class E>
    requires UserEpilogue<E, T>
  void run(const T* in, int num_tokens, const typename E::template Params<T>& params, cudaStream_t stream = nullptr,
           Strategy strategy = Strategy::Auto) {
    std::visit([&](auto& ws) { ws.template run<E>(in, num_tokens, params, stream, strategy); }, ws_);
  }
  void check() const {
    std::visit([](const auto& ws) { ws.check(); }, ws_);
  }

 private:
  // Every backend's workspace is a WorkspaceCore of (T, Pf): the queries are answered there, whichever runs.
  [[nodiscard]] const detail::WorkspaceCore<T, Pf>& core() const {
    return std::visit([](const auto& ws) -> const detail::WorkspaceCore<T, Pf>& { return ws; }, ws_);
  }

  Variant ws_;
  Resolution resolution_;
  bool fell_back_;
};

namespace detail {

// What each rank brings to make_workspace: its request and its view of the topology.
struct ChoiceRecord {
  std::int32_t requested;
  std::int32_t world_size;
  std::int32_t node_count;
  std::int32_t multicast;
  std::int32_t fabric;
  std::int32_t peer_access;
  std::int32_t arch;
  std::int32_t interconnect;
};

// This rank's request (FIAR_ALLREDUCE_BACKEND when none is given), checked with its topology: throws what a rank
// alone got wrong, for agree() to raise on every rank.
template <Bootstrap B>
Backend checked_request(B& boot, std::optional<Backend> requested, const Topology& topo) {
  const Backend b = requested ? *requested : backend_from_env();
  check_backend(b);
  validate_topology(topo);
  if (topo.world_size != boot.size() || topo.rank != boot.rank()) {
    throw std::invalid_argument("fiar: the topology says world_size " + std::to_string(topo.world_size) + ", rank " +
                                std::to_string(topo.rank) + ", but the bootstrap says size " +
                                std::to_string(boot.size()) + ", rank " + std::to_string(boot.rank()) +
                                ". Fix: discover the topology over the same bootstrap (discover_topology(boot)).");
  }
  return b;
}

// The facts every rank resolves on: world size and node count must agree; a capability counts only when every rank
// has it; the architecture is the lowest (unknown, 0, when any rank does not know it).
template <Bootstrap B>
std::pair<Backend, Topology> agree_on_choice(B& boot, std::optional<Backend> requested, const Topology& topo) {
  Backend mine_request = Backend::Auto;
  const StepOutcome local = attempt([&] { mine_request = checked_request(boot, requested, topo); });
  const ChoiceRecord mine{static_cast<std::int32_t>(mine_request),
                          topo.world_size,
                          topo.node_count,
                          topo.multicast_supported ? 1 : 0,
                          topo.fabric_handles_supported ? 1 : 0,
                          topo.node_peer_access ? 1 : 0,
                          topo.arch,
                          static_cast<std::int32_t>(topo.interconnect)};
  const auto all = agree(boot, local, mine, "make_workspace failed on rank {rank}");
  Topology merged = topo;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const ChoiceRecord& c = all[r];
    if (c.requested != all[0].requested) {
      throw std::invalid_argument("fiar: make_workspace: ranks requested different backends: rank 0 asked for '" +
                                  std::string(to_string(static_cast<Backend>(all[0].requested))) + "', rank " +
                                  std::to_string(r) + " for '" +
                                  std::string(to_string(static_cast<Backend>(c.requested))) +
                                  "'. Fix: pass the same backend on every rank (set " + std::string(backend_env_var) +
                                  " identically everywhere, or unset it).");
    }
    if (c.world_size != all[0].world_size || c.node_count != all[0].node_count) {
      throw std::invalid_argument(
          "fiar: make_workspace: ranks disagree about the group: rank 0 sees world_size " +
          std::to_string(all[0].world_size) + " on " + std::to_string(all[0].node_count) + " node(s), rank " +
          std::to_string(r) + " sees world_size " + std::to_string(c.world_size) + " on " +
          std::to_string(c.node_count) +
          " node(s). Fix: discover the topology collectively (discover_topology(boot)) or pass the same world_size and "
          "node_count on every rank.");
    }
    merged.multicast_supported = merged.multicast_supported && c.multicast != 0;
    merged.fabric_handles_supported = merged.fabric_handles_supported && c.fabric != 0;
    merged.node_peer_access = merged.node_peer_access && c.peer_access != 0;
    merged.arch = (merged.arch == 0 || c.arch == 0) ? 0 : std::min(merged.arch, static_cast<int>(c.arch));
    // PCIe as soon as one rank says so; NVLink only when every rank does.
    const auto theirs = static_cast<Interconnect>(c.interconnect);
    if (theirs == Interconnect::Pcie || merged.interconnect == Interconnect::Pcie) {
      merged.interconnect = Interconnect::Pcie;
    } else if (theirs != merged.interconnect) {
      merged.interconnect = Interconnect::Unknown;
    }
  }
  // Across nodes, multicast needs fabric handles on every rank (Topology::multicast_supported's meaning).
  if (merged.node_count > 1 && !merged.fabric_handles_supported) merged.multicast_supported = false;
  return {static_cast<Backend>(all[0].requested), merged};
}

// The info line of a workspace's backend choice: what runs, why (auto: why each better backend cannot run; after
// a fallback, that the multicast setup failed), for which group and shape.
template <ReduceType T>
std::string describe_choice(Backend ran, Backend agreed_request, bool from_env, const Resolution& res,
                            const Topology& merged, const WorkspaceConfig& config, bool fell_back) {
  std::string why = agreed_request != Backend::Auto
                        ? (from_env ? std::string(backend_env_var) + "=" + std::string(to_string(agreed_request))
                                    : std::string("requested"))
                        : std::string("auto");
  if (fell_back) why += "; " + std::string(to_string(res.backend)) + "'s multicast setup failed, fell back";
  std::string line = "workspace: backend " + std::string(to_string(ran)) + " (" + why + ") for " +
                     std::to_string(merged.world_size) + (merged.world_size == 1 ? " rank" : " ranks") + " on " +
                     std::to_string(merged.node_count) + (merged.node_count == 1 ? " node" : " nodes") + ", " +
                     std::string(dtype_name<T>()) + ", max " + std::to_string(config.max_token_num) + " tokens x " +
                     std::to_string(config.hidden_dim);
  if (agreed_request == Backend::Auto) {
    find_first(BackendPolicies{}, [&](auto p) {
      const Backend b = decltype(p)::type::backend;
      if (b == res.backend) return true;
      const std::string no = why_not(b, merged);
      line += "; " + std::string(to_string(b)) +
              (no.empty() ? " passed by: " + why_auto_skips(b, merged) : " cannot run: " + no);
      return false;
    });
    if (res.allow_trtllm_fallback && !fell_back) line += "; trtllm if multicast setup fails";
  }
  return line;
}

template <ReduceType T, class Pf, Bootstrap B>
AnyWorkspace<T, Pf> make_workspace(B& boot, const Topology& topology, const WorkspaceConfig& config,
                                   std::optional<Backend> requested, const typename Pf::Options& options) {
  auto [agreed_request, merged] = agree_on_choice(boot, requested, topology);
  merged.rank = topology.rank;
  const Resolution res = resolve_backend(agreed_request, merged);  // the same on every rank, or the same error
  // Every rank reaches the same decisions below (they are agreed collectively), so rank 0 speaks for the group.
  const bool speaks = merged.rank == 0;
  std::optional<AnyWorkspace<T, Pf>> made;
  Backend fallback = Backend::Auto;
  with_policy(res.backend, [&](auto p) {
    using P = typename decltype(p)::type;
    if constexpr (P::setup_fallback != Backend::Auto) {
      try {
        made.emplace(Workspace<P, T, Pf>(boot, merged, config, options), res, false);
      } catch (const multicast_error& e) {
        // Thrown on every rank alike (the platform agrees on the failure), so every rank decides the same here.
        if (!res.allow_trtllm_fallback) throw;
        fallback = P::setup_fallback;
        if (speaks) {
          const std::string to = std::string(to_string(fallback));
          log(LogLevel::Warning, "rank 0: backend auto chose " + std::string(to_string(P::backend)) +
                                     ", but NVLink multicast could not be set up; falling back to " + to + " on all " +
                                     std::to_string(merged.world_size) + " ranks. " + std::string(backend_env_var) +
                                     "=" + to + " skips the attempt; " + std::string(log_level_env_var) +
                                     "=debug says why.");
          if (log_enabled(LogLevel::Debug)) {
            log(LogLevel::Debug, "workspace: why multicast setup failed: " + without_fiar_prefix(e.what()));
          }
        }
      }
    } else {
      made.emplace(Workspace<P, T, Pf>(boot, merged, config, options), res, false);
    }
  });
  if (!made) {
    with_policy(fallback, [&](auto p) {
      using P = typename decltype(p)::type;
      made.emplace(Workspace<P, T, Pf>(boot, merged, config, options), res, true);
    });
  }
  if (speaks && log_enabled(LogLevel::Info)) {
    log(LogLevel::Info, describe_choice<T>(made->backend(), agreed_request, !requested.has_value(), res, merged, config,
                                           made->fell_back()));
  }
  return std::move(*made);
}

}  // namespace detail

/// Creates the workspace of the backend that FIAR_ALLREDUCE_BACKEND (unset: auto) resolves to on this group
/// (collective: every rank calls it with its own topology and the same config). The variable is read on every rank
/// and a bad value is raised on every rank alike. See the header comment for the guarantees.
///   auto ws = fiar::make_workspace<__nv_bfloat16>(boot, fiar::discover_topology(boot), cfg);
template <ReduceType T, Platform Pf = CudaPlatform, Bootstrap B>
AnyWorkspace<T, Pf> make_workspace(B& boot, const Topology& topology, const WorkspaceConfig& config) {
  return detail::make_workspace<T, Pf>(boot, topology, config, std::nullopt, typename Pf::Options{});
}

/// Creates the workspace of the backend `requested` resolves to on this group, with the platform's options.
template <ReduceType T, Platform Pf = CudaPlatform, Bootstrap B>
AnyWorkspace<T, Pf> make_workspace(B& boot, const Topology& topology, const WorkspaceConfig& config, Backend requested,
                                   const typename Pf::Options& options = typename Pf::Options{}) {
  return detail::make_workspace<T, Pf>(boot, topology, config, requested, options);
}

FIAR_END_NAMESPACE
