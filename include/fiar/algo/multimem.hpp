// SPDX-License-Identifier: Apache-2.0
// fiar/algo/multimem.hpp — the in-switch reduction of the mnnvl backend (Strategy::Multimem): the NVSwitch sums, each
// rank load-reduces its share of the call through the multicast mapping and stores the sum back through it; then
// every rank's epilogue reads the whole sum from its own memory.
// Contract: runs unchanged on the GPU (multimem.ld_reduce / multimem.st / multimem.red) and in the host emulator (the
// members' values summed in rank order in fp32); every rank gets the same bits (each share is reduced once, by one
// rank, and broadcast); the two barriers are counters in the multicast memory, one per cluster of blocks, so a
// cluster only ever waits for the same cluster on the other ranks; every wait ends by the deadline; the per-cluster
// generations live in the workspace (CUDA-graph safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "../exec/operation.hpp"
#include "../exec/vec.hpp"
#include "convert.hpp"
#include "epilogue.hpp"
#include "lamport.hpp"
#include "user_epilogue.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

/// Data words a multimem call of `tokens` tokens writes into one Lamport buffer, after the header: one copy of the
/// call (this rank's input, then the sum).
FIAR_HD constexpr std::size_t multimem_words(int tokens, int vecs_per_token) {
  return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(vecs_per_token) * exec::kWordsPerVec;
}

/// What a multimem call needs on top of a Lamport call's parameters.
template <ReduceType T, class Epi = EpilogueParams<T>>
struct MultimemParams {
  LamportParams<T, Epi> base;  ///< buffers, multicast view, state, error record, epilogue
  std::size_t counters;        ///< word offset of the barrier counters (one per token) in every rank's region and view
  std::uint32_t* generations;  ///< this rank's max_token_num words: each token counter's value after its last call
};

namespace detail {

template <ReduceType T>
FIAR_HD constexpr exec::ReduceKind reduce_kind() {
  if constexpr (sizeof(T) == 4) {
    return exec::ReduceKind::F32;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return exec::ReduceKind::BF16;
  } else {
    return exec::ReduceKind::F16;
  }
}

// One barrier of the cluster's tokens: after a cluster barrier (the cluster's accesses of this phase are done), one
// lane of the cluster's first block per token adds 1 to that token's counter on every rank (one multicast add), then
// waits until its own copy reaches the token's generation + phase x W. Counters are per token, and one rank arrives
// once per token whatever its launch shape, so ranks with different grids (SM counts, limits, cluster sizes) pair the
// same arrivals. Returns the cluster's verdict (false after a timeout, recorded, or a call already failed here).
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Epi, class Ctx>
FIAR_HD inline bool multimem_barrier(Ctx& ctx, const MultimemParams<T, Epi>& m, const exec::TokenSplit& split,
                                     std::uint32_t phase, const PollSite& site, bool ok) {
  const LamportParams<T, Epi>& p = m.base;
  ctx.cluster_sync();
  if (ok && ctx.cluster_rank() == 0) {
    const int first = split.first_token + ctx.lane() * split.token_step;
    const int step = ctx.lanes() * split.token_step;
    // fence.proxy.alias, once per arriving lane: the cluster's unicast stores (ordered before it by the cluster
    // barrier) before the add through the multicast alias; then the add before this lane's unicast poll of the same
    // word; and after the poll, the peers' multicast stores it observed before the unicast reads that follow.
    FIAR_NO_UNROLL
    for (int t = first; t < p.epi.num_tokens; t += step) {
      ctx.fence_multicast();
      ctx.multicast_add_release(p.multicast, m.counters + static_cast<std::size_t>(t), 1u);
    }
    ctx.fence_multicast();
    FIAR_NO_UNROLL
    for (int t = first; t < p.epi.num_tokens && ok; t += step) {
      const std::uint32_t target =
          ctx.load_relaxed(m.generations + t) + phase * static_cast<std::uint32_t>(p.world_size);
      const std::uint32_t* mine = p.buffers[p.rank] + m.counters + t;
      std::uint32_t spins = 0;
      while (static_cast<std::int32_t>(ctx.load_acquire(mine) - target) < 0) {
        // Every kSpinsPerCheck spins: the failure word and the clock (a barrier cannot name a late rank).
        if (++spins % spins_per_check<Ctx>() == 0 && stop_waiting<true>(ctx, site, 0, 0u, false)) {
          ok = false;
          break;
        }
        ctx.pause();
      }
    }
    ctx.fence_multicast();
  }
  return ctx.cluster_max(ok ? 0.0f : 1.0f) == 0.0f;  // the verdict of the first block, for the cluster (a barrier)
}

}  // namespace detail

/// The in-switch reduction. Per cluster of the launch, over the tokens it handles (token_split):
///   1. every rank stores its input into its own region (the current Lamport buffer, after the digests' header);
///   2. barrier 1 on each of those tokens' counters: every rank has stored them;
///   3. rank r load-reduces share r of each token's vectors through the multicast mapping (the switch sums the W
///      members) and stores the sum back through it, into every member;
///   4. barrier 2: every share is stored everywhere;
///   5. the epilogue reads the sums from this rank's own region.
/// The digests are exchanged and checked as in one-shot; a mismatch or a missing digest skips the waits, and the
/// call fails on every rank (its outputs are not the sum). The buffer rotation and clearing are the Lamport kernels'.
FIAR_EXEC_CHECK_DISABLE
template <auto P, ReduceType T, class Ctx>
FIAR_HD void multimem_allreduce(Ctx& ctx, const MultimemParams<T, CallParams<P, T>>& m) {
  using namespace detail;
  const LamportParams<T, CallParams<P, T>>& p = m.base;
  const CallFrame f = begin_call(ctx, p);
  const std::size_t data = f.cur + header_words(p.world_size);
  auto at = [&](int token, int vec) {
    return data +
           (static_cast<std::size_t>(token) * static_cast<std::size_t>(p.vecs_per_token) + vec) * exec::kWordsPerVec;
  };
  const exec::TokenSplit split = exec::token_split(ctx);
  const int cluster_lane = split.first_vec, cluster_lanes = split.vec_step;

  // 1. Digests, and this rank's input for the cluster's tokens into its own region.
  push_digest<Transport::Multicast>(ctx, p, f);
  for (int t = split.first_token; t < p.epi.num_tokens; t += split.token_step) {
    for (int v = cluster_lane; v < p.vecs_per_token; v += cluster_lanes) {
      ctx.store16(p.buffers[p.rank] + at(t, v), load_input<P>(ctx, p, t, v));
    }
  }
  clear_previous(ctx, p, f);
  PollSite site = check_digests(ctx, p, f);

  // 2. Barrier 1: the cluster's tokens are in place on every rank.
  bool ok = multimem_barrier(ctx, m, split, 1u, site, site.deadline != 0);
  if (!ok) site.deadline = 0;

  // 3. This rank's share of each of the cluster's tokens: load-reduce through the switch, store the sum to all.
  const int share = (p.vecs_per_token + p.world_size - 1) / p.world_size;
  const int first = p.rank * share;
  const int last = first + share < p.vecs_per_token ? first + share : p.vecs_per_token;
  for (int t = split.first_token; t < p.epi.num_tokens && ok; t += split.token_step) {
    for (int v = first + cluster_lane; v < last; v += cluster_lanes) {
      const Vec16 sum = ctx.multicast_ld_reduce16(p.multicast, at(t, v), reduce_kind<T>());
      ctx.multicast_store16(p.multicast, at(t, v), exec::sanitize<sizeof(T)>(sum));
    }
  }

  // 4. Barrier 2: every share is everywhere.
  ok = multimem_barrier(ctx, m, split, 2u, site, ok);

  // 5. The epilogue over the sums in this rank's memory (the waits above failed: whatever is there, flagged).
  for (int t = split.first_token; t < p.epi.num_tokens; t += split.token_step) {
    epilogue_token<P, T>(ctx, p.epi.out, p.epi, t, p.vecs_per_token,
                         [&](int v) { return exec::sanitize<sizeof(T)>(ctx.load16(p.buffers[p.rank] + at(t, v))); });
  }
  epilogue_call_outputs<P, T>(ctx, p.epi, p.epi.num_tokens, p.vecs_per_token * kElemsPerVec<T>);
  if (ctx.cluster_rank() == 0) {
    // Each token's counter advances by 2 W per call that has the token (failed ones too: the workspace is unusable
    // then anyway); only the lane that waited on it reads or writes its generation.
    for (int t = split.first_token + ctx.lane() * split.token_step; t < p.epi.num_tokens;
         t += ctx.lanes() * split.token_step) {
      ctx.store_relaxed(m.generations + t,
                        ctx.load_relaxed(m.generations + t) + 2u * static_cast<std::uint32_t>(p.world_size));
    }
  }
  finish_call(
      ctx, p.state, f,
      static_cast<std::uint32_t>(header_words(p.world_size) + multimem_words(p.epi.num_tokens, p.vecs_per_token)));
}

/// The operation of the in-switch reduction (mnnvl, Strategy::Multimem).
template <auto P, ReduceType T>
struct MultimemReduce : exec::PerTokenOperation<MultimemParams<T, CallParams<P, T>>, P, T> {
  using Params = MultimemParams<T, CallParams<P, T>>;  // named here: nvcc's host stub spells the kernel's parameter
                                                       // type through it
  static constexpr const char* name = "multimem";
  static constexpr int min_arch = epilogue_min_arch<P>();  ///< NVFP4: sm_100 and newer
  /// The Lamport kernels' launch (a cluster per token), from the call's shape in `base`.
  static constexpr exec::LaunchShape shape(const Params& m, const exec::LaunchLimits& limits) {
    return exec::spread_shape(m.base.epi.num_tokens, m.base.vecs_per_token, limits.max_blocks);
  }
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const Params& m) {
    multimem_allreduce<P, T>(ctx, m);
  }
};

}  // namespace algo
FIAR_END_NAMESPACE
