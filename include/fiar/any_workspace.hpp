// fiar/any_workspace.hpp — make_workspace(): the runtime backend choice, agreed by every rank, and
// AnyWorkspace<T, Platform>, the workspace of whichever backend was chosen.
// Contract: make_workspace is collective. Every rank ends with the same backend: the ranks exchange what they
// requested and what they know of the topology, and resolve the backend on the combined facts. An explicit
// request that cannot run throws std::invalid_argument on every rank before anything is allocated; it is
// never replaced by another backend. Auto that chose mnnvl falls back to trtllm only when the resolution
// allows it (one node, trtllm can run) and only when multicast setup failed (fiar::multicast_error), with one
// warning per rank through the log sink (log.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "errors.hpp"
#include "log.hpp"
#include "mnnvl.hpp"
#include "nccl.hpp"
#include "policy.hpp"
#include "resolve.hpp"
#include "topology.hpp"
#include "trtllm.hpp"
#include "version.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

/// The workspace make_workspace() created: one of the three backends' workspaces, chosen at run time.
/// Move-only; every member forwards to the backend's workspace.
template <ReduceType T, class Platform = CudaPlatform>
class AnyWorkspace {
 public:
  using value_type = T;
  using platform_type = Platform;
  using Trtllm = Workspace<TrtllmPolicy, T, Platform>;
  using Mnnvl = Workspace<MnnvlPolicy, T, Platform>;
  using Nccl = Workspace<NcclPolicy, T, Platform>;

  template <class W>
    requires std::is_same_v<W, Trtllm> || std::is_same_v<W, Mnnvl> || std::is_same_v<W, Nccl>
  AnyWorkspace(W&& ws, Resolution resolution, bool fell_back)
      : ws_(std::in_place_type<W>, std::move(ws)), resolution_(resolution), fell_back_(fell_back) {}

  AnyWorkspace(AnyWorkspace&&) noexcept = default;
  AnyWorkspace& operator=(AnyWorkspace&&) noexcept = default;
  AnyWorkspace(const AnyWorkspace&) = delete;
  AnyWorkspace& operator=(const AnyWorkspace&) = delete;

  /// The backend that runs the calls (trtllm after a fallback).
  [[nodiscard]] Backend backend() const {
    return visit([](const auto& ws) { return std::decay_t<decltype(ws)>::policy_type::backend; });
  }
  /// What resolve_backend chose on the group's combined topology (mnnvl when Auto fell back to trtllm).
  [[nodiscard]] Resolution resolution() const { return resolution_; }
  /// True when Auto chose mnnvl, multicast setup failed, and trtllm runs instead.
  [[nodiscard]] bool fell_back() const { return fell_back_; }

  /// The concrete workspace when the backend is P's, else nullptr.
  template <AllreducePolicy P>
  [[nodiscard]] Workspace<P, T, Platform>* get_if() {
    return std::get_if<Workspace<P, T, Platform>>(&ws_);
  }

  [[nodiscard]] const Topology& topology() const {
    return visit([](const auto& ws) -> const Topology& { return ws.topology(); });
  }
  [[nodiscard]] const WorkspaceConfig& config() const {
    return visit([](const auto& ws) -> const WorkspaceConfig& { return ws.config(); });
  }
  [[nodiscard]] int arch() const {
    return visit([](const auto& ws) { return ws.arch(); });
  }
  [[nodiscard]] Strategy strategy_for(int num_tokens) const {
    return visit([&](const auto& ws) { return ws.strategy_for(num_tokens); });
  }
  [[nodiscard]] Strategy last_strategy() const {
    return visit([](const auto& ws) { return ws.last_strategy(); });
  }
  /// Whether one call of num_tokens tokens with strategy s fits this workspace (the real per-call capacity).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    return visit([&](const auto& ws) { return ws.is_buffer_size_sufficient(num_tokens, s); });
  }

  void allreduce(const T* in, T* out, int num_tokens, cudaStream_t stream = nullptr,
                 Strategy strategy = Strategy::Auto) {
    visit([&](auto& ws) { ws.allreduce(in, out, num_tokens, stream, strategy); });
  }
  template <Pattern P>
  void run(const FusedArgs<T>& a, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    visit([&](auto& ws) { ws.template run<P>(a, stream, strategy); });
  }
  void check() const {
    visit([](const auto& ws) { ws.check(); });
  }

 private:
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), ws_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), ws_);
  }

  std::variant<Trtllm, Mnnvl, Nccl> ws_;
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
  std::int32_t reserved;
};

// The facts every rank resolves on: world size and node count must agree; a capability counts only when
// every rank has it; the architecture is the lowest (unknown, 0, when any rank does not know it).
template <Bootstrap B>
std::pair<Backend, Topology> agree_on_choice(B& boot, Backend requested, const Topology& topo) {
  ChoiceRecord mine{static_cast<std::int32_t>(requested), topo.world_size, topo.node_count,
                    topo.multicast_supported ? 1 : 0, topo.fabric_handles_supported ? 1 : 0,
                    topo.node_peer_access ? 1 : 0, topo.arch, 0};
  const auto all = all_gather_value(boot, mine);
  Topology merged = topo;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const ChoiceRecord& c = all[r];
    if (c.requested != all[0].requested) {
      throw std::invalid_argument(
          "fiar: make_workspace: ranks requested different backends: rank 0 asked for '" +
          std::string(to_string(static_cast<Backend>(all[0].requested))) + "', rank " + std::to_string(r) +
          " for '" + std::string(to_string(static_cast<Backend>(c.requested))) +
          "'. Fix: pass the same backend on every rank (set " + std::string(backend_env_var) +
          " identically everywhere, or unset it).");
    }
    if (c.world_size != all[0].world_size || c.node_count != all[0].node_count) {
      throw std::invalid_argument(
          "fiar: make_workspace: ranks disagree about the group: rank 0 sees world_size " +
          std::to_string(all[0].world_size) + " on " + std::to_string(all[0].node_count) + " node(s), rank " +
          std::to_string(r) + " sees world_size " + std::to_string(c.world_size) + " on " +
          std::to_string(c.node_count) + " node(s). Fix: discover the topology collectively (discover_topology(boot)) "
          "or pass the same world_size and node_count on every rank.");
    }
    merged.multicast_supported = merged.multicast_supported && c.multicast != 0;
    merged.fabric_handles_supported = merged.fabric_handles_supported && c.fabric != 0;
    merged.node_peer_access = merged.node_peer_access && c.peer_access != 0;
    merged.arch = (merged.arch == 0 || c.arch == 0) ? 0 : std::min(merged.arch, static_cast<int>(c.arch));
  }
  // Across nodes, multicast needs fabric handles on every rank (Topology::multicast_supported's meaning).
  if (merged.node_count > 1 && !merged.fabric_handles_supported) merged.multicast_supported = false;
  return {static_cast<Backend>(all[0].requested), merged};
}

}  // namespace detail

/// Creates the workspace of the backend `requested` resolves to on this group (collective: every rank calls
/// it with its own topology and the same config and request). See the header comment for the guarantees.
///   auto ws = fiar::make_workspace<__nv_bfloat16>(boot, fiar::discover_topology(boot), cfg);
template <ReduceType T, class Platform = CudaPlatform, Bootstrap B>
AnyWorkspace<T, Platform> make_workspace(B& boot, const Topology& topology, const WorkspaceConfig& config,
                                         Backend requested = backend_from_env(),
                                         const typename Platform::Options& options = typename Platform::Options{}) {
  auto [agreed_request, merged] = detail::agree_on_choice(boot, requested, topology);
  merged.rank = topology.rank;
  const Resolution res = resolve_backend(agreed_request, merged);  // the same on every rank, or the same error
  switch (res.backend) {
    case Backend::Trtllm:
      return AnyWorkspace<T, Platform>(Workspace<TrtllmPolicy, T, Platform>(boot, merged, config, options), res, false);
    case Backend::Nccl:
      return AnyWorkspace<T, Platform>(Workspace<NcclPolicy, T, Platform>(boot, merged, config, options), res, false);
    case Backend::Mnnvl:
    case Backend::Auto:
      break;
  }
  try {
    return AnyWorkspace<T, Platform>(Workspace<MnnvlPolicy, T, Platform>(boot, merged, config, options), res, false);
  } catch (const multicast_error& e) {
    // Thrown on every rank alike (the platform exchanges the failure), so every rank decides the same here.
    if (!res.allow_trtllm_fallback) throw;
    std::string why = e.what();
    if (why.rfind("fiar: ", 0) == 0) why.erase(0, 6);
    log(LogLevel::Warning,
        "rank " + std::to_string(merged.rank) + ": backend auto chose mnnvl, but NVLink multicast could not be set "
        "up; falling back to trtllm, which this single-node group can run. Set " + std::string(backend_env_var) +
        "=trtllm to skip the attempt. Why multicast failed: " + why);
  }
  return AnyWorkspace<T, Platform>(Workspace<TrtllmPolicy, T, Platform>(boot, merged, config, options), res, true);
}

}  // namespace fiar::inline v0_1
