// SPDX-License-Identifier: Apache-2.0
// fiar/backend/mnnvl.hpp — the mnnvl backend's kernels: the Lamport all-reduce over NVLink multicast (NVSwitch; across
// nodes with fabric handles, e.g. GB200 NVL72 with IMEX). Contract: each rank's region is bound to one multicast object
// of the group, so a value every rank needs is one multicast store (one-shot push, two-shot broadcast), and
// Strategy::Multimem lets the switch reduce (load-reduce and store through the multicast mapping); the two-shot scatter
// uses the peer mappings. Creation throws fiar::multicast_error on every rank alike when the machine cannot set
// multicast up. World sizes 1 to 64.
#pragma once

#include "../algo/lamport.hpp"
#include "../algo/multimem.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"

/// The operations this backend launches (<fiar/instantiate.cuh> emits one kernel per operation x pattern x dtype).
#define FIAR_MNNVL_OPERATIONS(X) FIAR_DETAIL_MNNVL_OPERATIONS_WITH(FIAR_DETAIL_APPLY, X)
// X(args..., Op) for each of them.
#define FIAR_DETAIL_MNNVL_OPERATIONS_WITH(X, ...) \
  X(__VA_ARGS__, MnnvlOneShot) X(__VA_ARGS__, MnnvlTwoShot) X(__VA_ARGS__, MnnvlMultimem)

FIAR_BEGIN_NAMESPACE

/// The mnnvl kernels: the Lamport protocols with the multicast transport, named for profiles and messages.
template <auto P, class T>
struct MnnvlOneShot : algo::LamportOneShot<algo::Transport::Multicast, P, T> {
  static constexpr const char* name = "mnnvl one-shot";
};
template <auto P, class T>
struct MnnvlTwoShot : algo::LamportTwoShot<algo::Transport::Multicast, P, T> {
  static constexpr const char* name = "mnnvl two-shot";
};
/// Strategy::Multimem: the NVSwitch reduces (algo/multimem.hpp).
template <auto P, class T>
struct MnnvlMultimem : algo::MultimemReduce<P, T> {
  static constexpr const char* name = "mnnvl multimem";
};

FIAR_END_NAMESPACE
