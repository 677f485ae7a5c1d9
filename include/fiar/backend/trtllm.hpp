// SPDX-License-Identifier: Apache-2.0
// fiar/backend/trtllm.hpp — the trtllm backend's kernels: the single-node, peer-mapped Lamport all-reduce.
// Contract: every rank of one node maps every other rank's region and pushes with one unicast store per rank;
// Workspace<TrtllmPolicy, T, Platform> (backend/workspace.hpp) runs them on its Lamport engine (backend/lamport.hpp);
// world sizes 1 to 16 (1 copies the input).
#pragma once

#include "../algo/lamport.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"

/// The operations this backend launches (<fiar/instantiate.cuh> emits one kernel per operation x pattern x dtype).
#define FIAR_TRTLLM_OPERATIONS(X) FIAR_DETAIL_TRTLLM_OPERATIONS_WITH(FIAR_DETAIL_APPLY, X)
// X(args..., Op) for each of them.
#define FIAR_DETAIL_TRTLLM_OPERATIONS_WITH(X, ...) X(__VA_ARGS__, TrtllmOneShot) X(__VA_ARGS__, TrtllmTwoShot)

FIAR_BEGIN_NAMESPACE

/// The trtllm kernels: the Lamport protocols with one unicast store per rank, named for profiles and messages.
template <auto P, class T>
struct TrtllmOneShot : algo::LamportOneShot<algo::Transport::Unicast, P, T> {
  static constexpr const char* name = "trtllm one-shot";
};
template <auto P, class T>
struct TrtllmTwoShot : algo::LamportTwoShot<algo::Transport::Unicast, P, T> {
  static constexpr const char* name = "trtllm two-shot";
};

FIAR_END_NAMESPACE
