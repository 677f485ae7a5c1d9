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

FIAR_BEGIN_NAMESPACE
namespace algo {

/// Barrier counters of the in-switch reduction: one word per cluster of a launch, after the three Lamport buffers of
/// the mnnvl region (zero at creation). A launch has at most this many clusters.
inline constexpr int kMultimemCounters = 1024;
/// ErrorRecord::code bit: a multimem barrier timed out (some rank's cluster never arrived; the barrier cannot tell
/// which).
inline constexpr std::uint32_t kErrorBarrier = 4;

/// Data words a multimem call of `tokens` tokens writes into one Lamport buffer, after the header: one copy of the
/// call (this rank's input, then the sum).
FIAR_HD constexpr std::size_t multimem_words(int tokens, int vecs_per_token) {
  return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(vecs_per_token) * exec::kWordsPerVec;
}

/// What a multimem call needs on top of a Lamport call's parameters.
template <ReduceType T>
struct MultimemParams {
  LamportParams<T> base;       ///< buffers, multicast view, state, error record, epilogue
  std::size_t counters;        ///< word offset of the barrier counters in every rank's region (and the view)
  std::uint32_t* generations;  ///< this rank's kMultimemCounters words: each counter's value after its last barrier
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

// One barrier of cluster c: every block of the cluster arrives on every rank's counter c (one multicast add per
// block), then waits until its own counter reaches `target`. Returns false (and records it) at the deadline.
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD inline bool multimem_barrier(Ctx& ctx, const MultimemParams<T>& m, int c, std::uint32_t target,
                                     const PollSite& site, bool& ok) {
  const LamportParams<T>& p = m.base;
  ctx.fence_multicast();  // this lane's unicast stores before the multicast accesses that follow (and vice versa)
  ctx.sync();             // every lane of the block has done its accesses
  if (ctx.lane() == 0) {
    ctx.multicast_add_release(p.multicast, m.counters + static_cast<std::size_t>(c), 1u);
    const std::uint32_t* mine = p.buffers[p.rank] + m.counters + c;
    while (static_cast<std::int32_t>(ctx.load_acquire(mine) - target) < 0) {
      if (site.deadline == 0 || ctx.now_ns() > site.deadline) {
        if (site.deadline != 0) {
          ctx.store_relaxed(&p.error->call, site.call);
          raise_code(ctx, p.error, kErrorBarrier | kErrorTimeout);
        }
        ok = false;
        break;
      }
      ctx.pause();
    }
  }
  ok = ctx.sum(ok ? 0.0f : 1.0f) == 0.0f;  // lane 0's verdict for the whole block (and a block barrier)
  ctx.fence_multicast();
  return ok;
}

}  // namespace detail

/// The in-switch reduction. Per cluster c of the launch, over the tokens c handles (token_split):
///   1. every rank stores its input into its own region (the current Lamport buffer, after the digests' header);
///   2. barrier 1 on counter c: every rank's cluster c has stored;
///   3. rank r load-reduces share r of the cluster's vectors through the multicast mapping (the switch sums the W
///      members) and stores the sum back through it, into every member;
///   4. barrier 2: every share is stored everywhere;
///   5. the epilogue reads the sums from this rank's own region.
/// The digests are exchanged and checked as in one-shot; a mismatch or a missing digest skips the waits, and the
/// call fails on every rank (its outputs are not the sum). The buffer rotation and clearing are the Lamport kernels'.
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, class Ctx>
FIAR_HD void multimem_allreduce(Ctx& ctx, const MultimemParams<T>& m) {
  using namespace detail;
  const LamportParams<T>& p = m.base;
  const CallFrame f = begin_call<P>(ctx, p, kDigestMultimem);
  const std::size_t data = f.cur + header_words(p.world_size);
  auto at = [&](int token, int vec) {
    return data +
           (static_cast<std::size_t>(token) * static_cast<std::size_t>(p.vecs_per_token) + vec) * exec::kWordsPerVec;
  };
  const exec::TokenSplit split = exec::token_split(ctx);
  const int c = split.first_token;  // the cluster's index: its first token
  const int cluster_lane = split.first_vec, cluster_lanes = split.vec_step;
  const std::uint32_t arrivals = static_cast<std::uint32_t>(ctx.cluster_size() * p.world_size);
  const std::uint32_t generation = ctx.load_relaxed(m.generations + c);
  bool ok = c < kMultimemCounters;
  if (!ok && ctx.lane() == 0 && ctx.cluster_rank() == 0) {
    ctx.store_relaxed(&p.error->call, f.call);
    raise_code(ctx, p.error, kErrorBarrier | kErrorTimeout);  // unreachable with fiar's launch shapes
  }

  // 1. Digests, and this rank's input for the cluster's tokens into its own region.
  push_digest<Transport::Multicast>(ctx, p, f);
  for (int t = split.first_token; t < p.num_tokens && ok; t += split.token_step) {
    for (int v = cluster_lane; v < p.vecs_per_token; v += cluster_lanes) {
      ctx.store16(p.buffers[p.rank] + at(t, v), load_input(p, t, v));
    }
  }
  clear_previous(ctx, p, f.call, f.prev);
  PollSite site = check_digests(ctx, p, f);

  // 2. Barrier 1: the cluster's inputs are in place on every rank.
  if (ok) multimem_barrier(ctx, m, c, generation + arrivals, site, ok);
  if (!ok) site.deadline = 0;

  // 3. This rank's share of each of the cluster's tokens: load-reduce through the switch, store the sum to all.
  const int share = (p.vecs_per_token + p.world_size - 1) / p.world_size;
  const int first = p.rank * share;
  const int last = first + share < p.vecs_per_token ? first + share : p.vecs_per_token;
  for (int t = split.first_token; t < p.num_tokens && ok; t += split.token_step) {
    for (int v = first + cluster_lane; v < last; v += cluster_lanes) {
      const Vec16 sum = ctx.multicast_ld_reduce16(p.multicast, at(t, v), reduce_kind<T>());
      ctx.multicast_store16(p.multicast, at(t, v), exec::sanitize<sizeof(T)>(sum));
    }
  }

  // 4. Barrier 2: every share is everywhere.
  if (ok) multimem_barrier(ctx, m, c, generation + 2 * arrivals, site, ok);

  // 5. The epilogue over the sums in this rank's memory (the waits above failed: whatever is there, flagged).
  for (int t = split.first_token; t < p.num_tokens; t += split.token_step) {
    finish_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token,
                       [&](int v) { return exec::sanitize<sizeof(T)>(ctx.load16(p.buffers[p.rank] + at(t, v))); });
  }
  finish_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);
  ctx.sync();
  if (ctx.lane() == 0 && ctx.cluster_rank() == 0 && c < kMultimemCounters) {
    // Every counter on every rank advances by 2 x arrivals per call whose launch has cluster c, failed ones too
    // (then the workspace is unusable anyway).
    ctx.store_relaxed(m.generations + c, generation + 2 * arrivals);
  }
  finish_call(ctx, p.state, f.call,
              static_cast<std::uint32_t>(header_words(p.world_size) + multimem_words(p.num_tokens, p.vecs_per_token)));
}

/// The operation of the in-switch reduction (mnnvl, Strategy::Multimem).
template <Pattern P, ReduceType T>
struct MultimemReduce : exec::PerTokenOperation<MultimemParams<T>, P, T> {
  using Params = MultimemParams<T>;  // named here: nvcc's host stub spells the kernel's parameter type through it
  static constexpr const char* name = "multimem";
  /// The Lamport kernels' launch (a cluster per token), from the call's shape in `base`.
  static constexpr exec::LaunchShape shape(const Params& m, const exec::LaunchLimits& limits) {
    return exec::spread_shape(m.base.num_tokens, m.base.vecs_per_token, limits.max_blocks);
  }
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const Params& m) {
    multimem_allreduce<P, T>(ctx, m);
  }
};

}  // namespace algo
FIAR_END_NAMESPACE
