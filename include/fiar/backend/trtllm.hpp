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
#define FIAR_TRTLLM_OPERATIONS(X) X(TrtllmOneShot) X(TrtllmTwoShot)

FIAR_BEGIN_NAMESPACE

/// The trtllm kernels: the Lamport protocols with one unicast store per rank, named for profiles and messages.
template <Pattern P, class T>
struct TrtllmOneShot : algo::LamportOneShot<algo::Transport::Unicast, P, T> {
  static constexpr const char* name = "trtllm one-shot";
};
template <Pattern P, class T>
struct TrtllmTwoShot : algo::LamportTwoShot<algo::Transport::Unicast, P, T> {
  static constexpr const char* name = "trtllm two-shot";
};

FIAR_END_NAMESPACE
