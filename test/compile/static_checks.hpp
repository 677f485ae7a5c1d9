// SPDX-License-Identifier: Apache-2.0
// Constant-expression checks of the public contract, compiled by g++ (unit suite) and by nvcc for every
// architecture (compile suite). A failing check is a build failure.
#pragma once

#include <fiar/fiar.hpp>

#include <type_traits>

namespace fiar_static_checks {

using fiar::Backend;
using fiar::Resolution;
using fiar::Topology;

// Names and parsing.
static_assert(fiar::to_string(Backend::Auto) == "auto");
static_assert(fiar::to_string(Backend::Nccl) == "nccl");
static_assert(fiar::parse_backend("trtllm") == Backend::Trtllm);
static_assert(fiar::parse_backend("  MnNvL\t") == Backend::Mnnvl);
static_assert(fiar::parse_backend("NCCL") == Backend::Nccl);
static_assert(fiar::parse_backend("Auto\n") == Backend::Auto);

// Topology is a structural aggregate with the contract's leading members.
static_assert(std::is_aggregate_v<Topology>);
inline constexpr Topology kOneNode{.world_size = 8, .rank = 0, .node_count = 1, .multicast_supported = false};
inline constexpr Topology kOneNodeMulticast{8, 0, 1, true};
inline constexpr Topology kTwoNodes{16, 0, 2, false};
inline constexpr Topology kTwoNodesMulticast{16, 0, 2, true, true};
inline constexpr Topology kNoPeers{.world_size = 4, .node_peer_access = false};

// Auto, at compile time.
static_assert(fiar::resolve_backend(Backend::Auto, kOneNode) == Resolution{Backend::Trtllm, false});
static_assert(fiar::resolve_backend(Backend::Auto, kOneNodeMulticast) == Resolution{Backend::Mnnvl, true});
static_assert(fiar::resolve_backend(Backend::Auto, kTwoNodes) == Resolution{Backend::Nccl, false});
static_assert(fiar::resolve_backend(Backend::Auto, kTwoNodesMulticast) == Resolution{Backend::Mnnvl, false});
static_assert(fiar::resolve_backend(Backend::Auto, kNoPeers) == Resolution{Backend::Nccl, false});
static_assert(fiar::resolve_backend(Backend::Auto, Topology{.world_size = 17}).backend == Backend::Nccl);

// Explicit choices that are valid resolve to themselves.
static_assert(fiar::resolve_backend(Backend::Trtllm, kOneNode) == Resolution{Backend::Trtllm, false});
static_assert(fiar::resolve_backend(Backend::Trtllm, Topology{.world_size = 16}).backend == Backend::Trtllm);
static_assert(fiar::resolve_backend(Backend::Trtllm, Topology{.world_size = 6, .rank = 5}).backend == Backend::Trtllm);
static_assert(fiar::resolve_backend(Backend::Mnnvl, kTwoNodesMulticast) == Resolution{Backend::Mnnvl, false});
static_assert(fiar::resolve_backend(Backend::Nccl, kTwoNodes) == Resolution{Backend::Nccl, false});

// The predicates behind the rules.
static_assert(fiar::rejection_for(Backend::Trtllm, kTwoNodes) == fiar::Rejection::spans_nodes);
static_assert(fiar::rejection_for(Backend::Trtllm, Topology{.world_size = 17}) == fiar::Rejection::world_size);
static_assert(fiar::rejection_for(Backend::Trtllm, kNoPeers) == fiar::Rejection::peer_access);
static_assert(fiar::rejection_for(Backend::Mnnvl, kOneNode) == fiar::Rejection::multicast);
static_assert(fiar::rejection_for(Backend::Mnnvl, Topology{.world_size = 2, .multicast_supported = true, .arch = 80}) ==
              fiar::Rejection::arch);
static_assert(fiar::can_run_on(Backend::Nccl, kTwoNodes));

// Policies.
static_assert(std::is_same_v<fiar::policy_for_t<kOneNode>, fiar::TrtllmPolicy>);
static_assert(std::is_same_v<fiar::policy_for_t<kOneNodeMulticast>, fiar::MnnvlPolicy>);
static_assert(std::is_same_v<fiar::policy_for_t<kTwoNodes>, fiar::NcclPolicy>);
static_assert(std::is_same_v<fiar::policy_for_t<kTwoNodesMulticast>, fiar::MnnvlPolicy>);
static_assert(fiar::AllreducePolicy<fiar::TrtllmPolicy>);
static_assert(fiar::AllreducePolicy<fiar::MnnvlPolicy>);
static_assert(fiar::AllreducePolicy<fiar::NcclPolicy>);
static_assert(!fiar::AllreducePolicy<int>);
static_assert(!fiar::AllreducePolicy<const fiar::TrtllmPolicy>);
struct LooksLikeAPolicy : fiar::TrtllmPolicy {};  // has every fact, but is not one of fiar's policies
static_assert(!fiar::AllreducePolicy<LooksLikeAPolicy>);
static_assert(fiar::TrtllmPolicy::backend == Backend::Trtllm && !fiar::TrtllmPolicy::multi_node);
static_assert(fiar::MnnvlPolicy::needs_multicast && fiar::MnnvlPolicy::multi_node);
static_assert(fiar::NcclPolicy::multi_node && !fiar::NcclPolicy::custom_kernels);

// Element types.
static_assert(fiar::ReduceType<float>);
static_assert(fiar::ReduceType<__half>);
static_assert(fiar::ReduceType<__nv_bfloat16>);
static_assert(!fiar::ReduceType<double>);
static_assert(!fiar::ReduceType<int>);
static_assert(!fiar::ReduceType<const float>);
static_assert(!fiar::ReduceType<__half2>);
static_assert(fiar::dtype_name<__nv_bfloat16>() == "bf16");

// check_topology is usable in constant expressions.
consteval bool trtllm_fits_one_node() {
  fiar::check_topology<fiar::TrtllmPolicy>(kOneNode);
  fiar::check_topology<fiar::NcclPolicy>(kTwoNodes);
  return true;
}
static_assert(trtllm_fits_one_node());

}  // namespace fiar_static_checks
