// SPDX-License-Identifier: Apache-2.0
// fiar/core/policy.hpp — the backend policy types, the list of backends, and the concept that constrains Workspace.
// Contract: a policy is a small struct of static facts about one backend; BackendPolicies lists every backend once,
// in the order Backend::Auto tries them; AllreducePolicy holds for exactly those policies, and the topology rules
// read only their facts.
#pragma once

#include <concepts>
#include <limits>
#include <type_traits>

#include "backend.hpp"
#include "prelude.hpp"
#include "type_list.hpp"

FIAR_BEGIN_NAMESPACE

/// Single-node backend: every rank maps every peer's GPU memory (CUDA VMM / IPC) and runs the Lamport one-shot or
/// the two-shot protocol over those mappings. Any world size from 1 to 16 (1 is a copy).
struct TrtllmPolicy {
  static constexpr Backend backend = Backend::Trtllm;
  static constexpr bool multi_node = false;        ///< can a group span nodes?
  static constexpr bool needs_multicast = false;   ///< needs NVLink (NVSwitch) multicast?
  static constexpr bool needs_peer_access = true;  ///< needs node-local peer mapping?
  static constexpr bool custom_kernels = true;     ///< runs fiar's own kernels (else a library collective)
  static constexpr int min_world_size = 1;
  static constexpr int max_world_size = 16;
  static constexpr int min_arch = 90;  ///< lowest compute capability x10 the kernels are built for
  /// What Backend::Auto falls back to when this backend's setup fails on the machine (Auto: nothing).
  static constexpr Backend setup_fallback = Backend::Auto;
  /// The most ranks of a node where Auto picks it on a PCIe-only interconnect: each rank pushes its data to every
  /// peer, W - 1 copies over the PCIe switches, so beyond 2 ranks NCCL's ring wins.
  static constexpr int pcie_max_ranks = 2;
};

/// NVLink-multicast backend: one allocation bound to a multicast object; a store through the multicast address
/// reaches every rank. Needs NVSwitch multicast (and fabric handles across nodes, e.g. GB200 NVL72 with IMEX).
/// World sizes 1 to 64.
struct MnnvlPolicy {
  static constexpr Backend backend = Backend::Mnnvl;
  static constexpr bool multi_node = true;
  static constexpr bool needs_multicast = true;
  static constexpr bool needs_peer_access = false;  // implied by multicast within the NVLink domain
  static constexpr bool custom_kernels = true;
  static constexpr int min_world_size = 1;
  static constexpr int max_world_size = 64;
  static constexpr int min_arch = 90;
  /// The GPUs report multicast, but the multicast object may still not form (bridged NVLink): then trtllm.
  static constexpr Backend setup_fallback = Backend::Trtllm;
  /// Multicast needs NVLink: a PCIe-only node never gets here (multicast_supported is false there).
  static constexpr int pcie_max_ranks = std::numeric_limits<int>::max();
};

/// The fallback that always works: ncclAllReduce, then fiar's fused epilogue as a separate kernel.
struct NcclPolicy {
  static constexpr Backend backend = Backend::Nccl;
  static constexpr bool multi_node = true;
  static constexpr bool needs_multicast = false;
  static constexpr bool needs_peer_access = false;
  static constexpr bool custom_kernels = false;
  static constexpr int min_world_size = 1;
  static constexpr int max_world_size = std::numeric_limits<int>::max();
  static constexpr int min_arch = 0;
  static constexpr Backend setup_fallback = Backend::Auto;
  static constexpr int pcie_max_ranks = std::numeric_limits<int>::max();  ///< NCCL's algorithms suit PCIe
};

/// Every backend's policy, once, in the order Backend::Auto tries them: the first that can run on the group wins
/// (nccl, last, runs on any topology). Everything that enumerates backends derives from this list.
using BackendPolicies = TypeList<MnnvlPolicy, TrtllmPolicy, NcclPolicy>;

/// One of fiar's backend policies, with well-formed facts.
template <class P>
concept AllreducePolicy = contains_v<BackendPolicies, P> && requires {
  requires std::same_as<decltype(P::backend), const Backend>;
  requires P::backend != Backend::Auto;
  requires std::same_as<decltype(P::multi_node), const bool>;
  requires std::same_as<decltype(P::needs_multicast), const bool>;
  requires std::same_as<decltype(P::needs_peer_access), const bool>;
  requires std::same_as<decltype(P::custom_kernels), const bool>;
  requires(1 <= P::min_world_size) && (P::min_world_size <= P::max_world_size);
  requires P::min_arch >= 0;
  requires std::same_as<decltype(P::setup_fallback), const Backend>;
  requires std::same_as<decltype(P::pcie_max_ranks), const int>;
};

namespace detail {
template <Backend B, class... Ps>
struct policy_search {};  // no `type`: B has no policy (Backend::Auto)
template <Backend B, class P, class... Ps>
struct policy_search<B, P, Ps...>
    : std::conditional_t<P::backend == B, std::type_identity<P>, policy_search<B, Ps...>> {};
template <Backend B>
struct policy_search_in {
  template <class... Ps>
  using in = policy_search<B, Ps...>;
};
}  // namespace detail

/// The policy type of a concrete backend (Backend::Auto has none: resolve it first).
template <Backend B>
struct policy_for_backend : apply_t<BackendPolicies, detail::policy_search_in<B>::template in> {};
template <Backend B>
using policy_for_backend_t = typename policy_for_backend<B>::type;

/// Calls f(std::type_identity<P>{}) with the policy P of backend b; returns false (calling nothing) when b has
/// none (Backend::Auto, or a value outside the enumeration).
template <class F>
constexpr bool with_policy(Backend b, F&& f) {
  return find_first(BackendPolicies{}, [&](auto p) {
    if (decltype(p)::type::backend != b) return false;
    f(p);
    return true;
  });
}

FIAR_END_NAMESPACE
