// fiar/policy.hpp — the backend policy types and the concepts that constrain Workspace.
// Contract: a policy is a small struct of static facts about one backend; AllreducePolicy holds for
// exactly TrtllmPolicy, MnnvlPolicy and NcclPolicy, and the topology rules read only these facts.
#pragma once

#include <concepts>
#include <limits>
#include <string_view>

#include "backend.hpp"
#include "version.hpp"

namespace fiar::inline v0_1 {

/// Single-node backend: every rank maps every peer's GPU memory (CUDA VMM / IPC) and runs the Lamport
/// one-shot or the two-shot protocol over those mappings. Any world size from 1 to 16 (1 is a copy).
struct TrtllmPolicy {
  static constexpr Backend backend = Backend::Trtllm;
  static constexpr bool multi_node = false;        ///< can a group span nodes?
  static constexpr bool needs_multicast = false;   ///< needs NVLink (NVSwitch) multicast?
  static constexpr bool needs_peer_access = true;  ///< needs node-local peer mapping?
  static constexpr bool custom_kernels = true;     ///< runs fiar's own kernels (else a library collective)
  static constexpr int min_world_size = 1;
  static constexpr int max_world_size = 16;
  static constexpr int min_arch = 90;  ///< lowest compute capability x10 the kernels are built for
};

/// NVLink-multicast backend: one allocation bound to a multicast object; a store through the multicast
/// address reaches every rank. Needs NVSwitch multicast (and fabric handles across nodes, e.g. GB200
/// NVL72 with IMEX). World sizes 1 to 64.
struct MnnvlPolicy {
  static constexpr Backend backend = Backend::Mnnvl;
  static constexpr bool multi_node = true;
  static constexpr bool needs_multicast = true;
  static constexpr bool needs_peer_access = false;  // implied by multicast within the NVLink domain
  static constexpr bool custom_kernels = true;
  static constexpr int min_world_size = 1;
  static constexpr int max_world_size = 64;
  static constexpr int min_arch = 90;
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
};

namespace detail {
// The closed set of policies: AllreducePolicy is true for these and nothing else.
template <class P>
inline constexpr bool is_builtin_policy = false;
template <>
inline constexpr bool is_builtin_policy<TrtllmPolicy> = true;
template <>
inline constexpr bool is_builtin_policy<MnnvlPolicy> = true;
template <>
inline constexpr bool is_builtin_policy<NcclPolicy> = true;
}  // namespace detail

/// One of fiar's backend policies, with well-formed facts.
template <class P>
concept AllreducePolicy = detail::is_builtin_policy<P> && requires {
  requires std::same_as<decltype(P::backend), const Backend>;
  requires P::backend != Backend::Auto;
  requires std::same_as<decltype(P::multi_node), const bool>;
  requires std::same_as<decltype(P::needs_multicast), const bool>;
  requires std::same_as<decltype(P::needs_peer_access), const bool>;
  requires std::same_as<decltype(P::custom_kernels), const bool>;
  requires 1 <= P::min_world_size && P::min_world_size <= P::max_world_size;
  requires P::min_arch >= 0;
};

/// The policy type of a concrete backend (Backend::Auto has none: resolve it first).
template <Backend B>
struct policy_for_backend;
template <>
struct policy_for_backend<Backend::Trtllm> {
  using type = TrtllmPolicy;
};
template <>
struct policy_for_backend<Backend::Mnnvl> {
  using type = MnnvlPolicy;
};
template <>
struct policy_for_backend<Backend::Nccl> {
  using type = NcclPolicy;
};
template <Backend B>
using policy_for_backend_t = typename policy_for_backend<B>::type;

}  // namespace fiar::inline v0_1
