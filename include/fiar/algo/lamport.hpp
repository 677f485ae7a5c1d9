// SPDX-License-Identifier: Apache-2.0
// fiar/algo/lamport.hpp — the Lamport protocols of the trtllm and mnnvl backends, written once against an execution
// context and a transport, and the operations (LamportOneShot, LamportTwoShot) that launch them.
// Contract: lamport_oneshot and lamport_twoshot run unchanged on the GPU (DeviceCtx) and in the host emulator
// (HostCtx); every rank gets identical bits (fixed rank order, fp32); all state lives in the workspace, so the
// kernels are CUDA-graph safe; every wait ends by the deadline. The transport only changes how a value reaches every
// rank: W unicast stores (trtllm) or one multicast store (mnnvl).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "../exec/operation.hpp"
#include "../exec/vec.hpp"
#include "convert.hpp"
#include "epilogue.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

/// Most ranks a Lamport kernel addresses (MnnvlPolicy::max_world_size; trtllm stops at 16).
inline constexpr int kMaxRanks = 64;

/// How a value that every rank needs is delivered: one unicast store per rank (peer mappings, trtllm), or
/// one store through the group's multicast mapping, which the NVSwitch replicates into every rank's memory
/// (mnnvl). Stores to a single rank (two-shot scatter) and all loads are unicast either way.
enum class Transport { Unicast, Multicast };

/// The group's multicast mapping of the Lamport region, as a kernel sees it (exec/context.hpp).
using MulticastView = exec::MulticastView;

/// Lamport buffers that rotate: a rank is at most one call ahead of its slowest peer.
inline constexpr int kLamportBuffers = 3;

/// Protocol state of one rank, in that rank's memory, advanced only by the kernels.
struct LamportState {
  std::uint32_t call;            ///< calls completed; the current buffer is call % 3
  std::uint32_t dirty_words[3];  ///< words each buffer's last call wrote (cleared two calls later)
  std::uint32_t arrived;         ///< blocks of the running call that have finished
  std::uint32_t reserved;
};

/// Where a kernel reports a failure; host-visible, read by Workspace::check().
struct ErrorRecord {
  std::uint32_t code;        ///< kErrorNone, or kErrorTimeout and / or kErrorMismatch (bits)
  std::uint32_t call;        ///< the call (LamportState::call) that timed out
  std::uint32_t missing[2];  ///< bit r of the 64-bit mask (word r / 32): data sent by rank r itself never arrived
  std::uint32_t stalled[2];  ///< bit r: a result rank r reduces (two-shot owner) never arrived
  std::uint32_t claim;       ///< the first lane to see a mismatch claims the record below (0 unclaimed)
  std::uint32_t peer;        ///< kErrorMismatch: the rank whose call digest differs from this rank's
  std::uint32_t theirs[4];   ///< its digest (CallDigest words)
  std::uint32_t mine[4];     ///< this rank's digest
};
inline constexpr std::uint32_t kErrorNone = 0;
inline constexpr std::uint32_t kErrorTimeout = 1;
inline constexpr std::uint32_t kErrorMismatch = 2;

/// What every call tells its peers about itself, in the header of the Lamport buffer it uses: the call number
/// (31 bits), num_tokens, the pattern and the strategy that runs (1 one-shot, 2 two-shot). No word is ever the
/// sentinel.
struct CallDigest {
  std::uint32_t call, num_tokens, pattern, strategy;
  friend constexpr bool operator==(const CallDigest&, const CallDigest&) = default;
};
inline constexpr std::uint32_t kDigestOneShot = 1;
inline constexpr std::uint32_t kDigestTwoShot = 2;
inline constexpr std::uint32_t kDigestMultimem = 3;  ///< the in-switch reduction (algo/multimem.hpp)

/// Everything one rank's kernel needs for one call.
template <ReduceType T>
struct LamportParams {
  const T* in;  ///< [num_tokens, hidden_dim], this rank's contribution
  T* out;       ///< [num_tokens, hidden_dim], may equal in
  int num_tokens;
  int vecs_per_token;  ///< hidden_dim * sizeof(T) / 16
  int world_size;
  int rank;
  std::uint32_t* buffers[kMaxRanks];  ///< each rank's Lamport region (3 buffers), as mapped here
  MulticastView multicast;            ///< Transport::Multicast: the group's multicast mapping
  std::size_t buffer_words;           ///< words per Lamport buffer
  LamportState* state;                ///< this rank's state
  ErrorRecord* error;                 ///< this rank's error record
  std::uint64_t timeout_ns;           ///< per call, from the kernel's start
  bool verify;                        ///< exchange and compare call digests (WorkspaceConfig::verify_calls)
  EpilogueParams<T> epi;              ///< fused outputs (Pattern other than AllReduce)
};

/// Words of a buffer's header: one call digest (one Vec16) per rank, at the start of every Lamport buffer.
FIAR_HD constexpr std::size_t header_words(int world) { return static_cast<std::size_t>(world) * exec::kWordsPerVec; }
/// Data words a call of `tokens` tokens writes into one Lamport buffer, after the header.
FIAR_HD constexpr std::size_t oneshot_words(int world, int tokens, int vecs_per_token) {
  return static_cast<std::size_t>(world) * static_cast<std::size_t>(tokens) * static_cast<std::size_t>(vecs_per_token) *
         exec::kWordsPerVec;
}
FIAR_HD constexpr int twoshot_chunk(int world, int tokens) { return (tokens + world - 1) / world; }
FIAR_HD constexpr std::size_t twoshot_words(int world, int tokens, int vecs_per_token) {
  const std::size_t scatter = static_cast<std::size_t>(world) * static_cast<std::size_t>(twoshot_chunk(world, tokens));
  return (scatter + static_cast<std::size_t>(tokens)) * static_cast<std::size_t>(vecs_per_token) * exec::kWordsPerVec;
}

namespace detail {

using exec::Vec16;

/// Loads a poll keeps in flight: W slots are read 4 at a time, then summed in rank order.
inline constexpr int kPollsInFlight = 4;

FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void raise_code(Ctx& ctx, ErrorRecord* error, std::uint32_t code) {
  ctx.fence_system();  // what was recorded before is visible before the code
  ctx.fetch_or_relaxed(&error->code, code);
}

FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void record_timeout(Ctx& ctx, ErrorRecord* error, int peer, bool relayed, std::uint32_t call) {
  std::uint32_t* mask = relayed ? error->stalled : error->missing;
  ctx.fetch_or_relaxed(mask + (peer >> 5), 1u << (peer & 31));
  ctx.store_relaxed(&error->call, call);
  raise_code(ctx, error, kErrorTimeout);
}

// The first lane to see a mismatch records both digests; every lane that sees one stops trusting the call.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void record_mismatch(Ctx& ctx, ErrorRecord* error, int peer, const Vec16& theirs, const Vec16& mine) {
  if (ctx.fetch_add_acq_rel(&error->claim, 1u) != 0) return;
  ctx.store_relaxed(&error->peer, static_cast<std::uint32_t>(peer));
  const std::uint32_t t[4] = {theirs.x, theirs.y, theirs.z, theirs.w};
  const std::uint32_t m[4] = {mine.x, mine.y, mine.z, mine.w};
  for (int i = 0; i < 4; ++i) {
    ctx.store_relaxed(&error->theirs[i], t[i]);
    ctx.store_relaxed(&error->mine[i], m[i]);
  }
  raise_code(ctx, error, kErrorMismatch);
}

// Where a poll reads, and what it does when its data is late.
struct PollSite {
  std::uint64_t deadline;  ///< 0: the call is already failed here, do not wait (and record nothing)
  ErrorRecord* error;
  std::uint32_t call;
};

// Waits for one Vec16 of this rank's buffer whose first load `v` still held the sentinel, until no word is the
// sentinel, or the deadline passes (then records it and returns false). `peer` sent it; `relayed` when peer only
// forwards a result it reduced (two-shot), so its lateness may be another's.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline bool wait_for(Ctx& ctx, const std::uint32_t* p, Vec16& v, const PollSite& site, int peer, bool relayed) {
  while (exec::has_sentinel(v)) {
    if (site.deadline == 0) return false;
    if (ctx.now_ns() > site.deadline) {
      record_timeout(ctx, site.error, peer, relayed, site.call);
      return false;
    }
    ctx.pause();
    v = ctx.load16(p);
  }
  return true;
}

FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline Vec16 poll(Ctx& ctx, const std::uint32_t* p, const PollSite& site, int peer, bool relayed) {
  Vec16 v = ctx.load16(p);
  if (exec::has_sentinel(v)) wait_for(ctx, p, v, site, peer, relayed);  // a timeout is in the error record
  return v;
}

// Waits until none of the n slots `first + i * stride` (i < n) of this rank's buffer holds the sentinel, one after
// the other (the slow path of a batch: nothing is kept in registers, so the batch is simply loaded again after it).
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline bool wait_for_batch(Ctx& ctx, const std::uint32_t* first, std::size_t stride, int r0, int n,
                                   const PollSite& site) {
  bool ok = true;
  FIAR_NO_UNROLL
  for (int i = 0; i < n; ++i) {
    const std::uint32_t* at = first + static_cast<std::size_t>(r0 + i) * stride;
    Vec16 v = ctx.load16(at);
    ok = wait_for(ctx, at, v, site, r0 + i, false) && ok;
  }
  return ok;
}

// Loads the batch of slots r0 .. r0 + kPollsInFlight - 1 (those below world) back to back.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline bool load_batch(Ctx& ctx, const std::uint32_t* first, std::size_t stride, int r0, int world,
                               Vec16 (&y)[kPollsInFlight]) {
  bool late = false;
  FIAR_UNROLL
  for (int i = 0; i < kPollsInFlight; ++i) {
    y[i] = r0 + i < world ? ctx.load16(first + static_cast<std::size_t>(r0 + i) * stride) : Vec16{0, 0, 0, 0};
  }
  FIAR_UNROLL
  for (int i = 0; i < kPollsInFlight; ++i) late = late || exec::has_sentinel(y[i]);
  return late;
}

// The sum, in rank order in fp32, of the W slots `first + r * stride` (r = 0 .. W-1) of this rank's buffer, polled
// kPollsInFlight at a time. `ok` turns false when one of them did not arrive.
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD inline FloatPack<T> reduce_slots(Ctx& ctx, const std::uint32_t* first, std::size_t stride, int world,
                                         const PollSite& site, bool& ok) {
  FloatPack<T> acc{};
  for (int r0 = 0; r0 < world; r0 += kPollsInFlight) {
    Vec16 y[kPollsInFlight];
    if (load_batch(ctx, first, stride, r0, world, y)) {
      const int n = world - r0 < kPollsInFlight ? world - r0 : kPollsInFlight;
      ok = wait_for_batch(ctx, first, stride, r0, n, site) && ok;
      load_batch(ctx, first, stride, r0, world, y);
    }
    FIAR_UNROLL
    for (int i = 0; i < kPollsInFlight; ++i) {
      if (r0 + i < world) unpack_add<T>(y[i], acc);
    }
  }
  return acc;
}

// Overwrites the first `words` words of a buffer with the sentinel, spread over every lane of the grid.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void clear(Ctx& ctx, std::uint32_t* buffer, std::size_t words) {
  const std::size_t stride =
      static_cast<std::size_t>(ctx.lanes()) * static_cast<std::size_t>(ctx.blocks()) * fiar::exec::kWordsPerVec;
  std::size_t i = (static_cast<std::size_t>(ctx.block()) * static_cast<std::size_t>(ctx.lanes()) +
                   static_cast<std::size_t>(ctx.lane())) *
                  fiar::exec::kWordsPerVec;
  for (; i < words; i += stride) ctx.store16(buffer + i, exec::sentinel_vec());
}

// Clears the previous call's buffer, then one lane per block fences at system scope: with the block
// barrier, that orders every lane's clearing before this rank's next push, which peers must observe
// before they write into the cleared buffer again.
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD inline void clear_previous(Ctx& ctx, const LamportParams<T>& p, std::uint32_t call, std::size_t prev) {
  clear(ctx, p.buffers[p.rank] + prev, ctx.load_relaxed(&p.state->dirty_words[(call + 2) % kLamportBuffers]));
  ctx.sync();
  if (ctx.lane() == 0) ctx.fence_system();
}

// The last block to finish publishes the next state: buffer rotation and the size to clear.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void finish_call(Ctx& ctx, LamportState* state, std::uint32_t call, std::uint32_t used_words) {
  ctx.sync();
  if (ctx.lane() == 0) {
    const std::uint32_t before = ctx.fetch_add_acq_rel(&state->arrived, 1u);
    if (before + 1 == static_cast<std::uint32_t>(ctx.blocks())) {
      ctx.store_relaxed(&state->dirty_words[call % kLamportBuffers], used_words);
      ctx.store_relaxed(&state->arrived, 0u);
      ctx.store_release(&state->call, call + 1);
    }
  }
}

// Stores v at word `offset` of every rank's region: through the multicast mapping (one store), or one
// unicast store per rank, starting with the next rank to spread the traffic.
FIAR_EXEC_CHECK_DISABLE
template <Transport X, ReduceType T, class Ctx>
FIAR_HD inline void store_to_all(Ctx& ctx, const LamportParams<T>& p, std::size_t offset, const Vec16& v) {
  if constexpr (X == Transport::Multicast) {
    ctx.multicast_store16(p.multicast, offset, v);
  } else {
    for (int i = 0; i < p.world_size; ++i) {
      const int r = (p.rank + 1 + i) % p.world_size;
      ctx.store16(p.buffers[r] + offset, v);
    }
  }
}

template <ReduceType T>
FIAR_HD inline Vec16 load_input(const LamportParams<T>& p, int token, int vec) {
  const Vec16* row = reinterpret_cast<const Vec16*>(p.in) + static_cast<std::size_t>(token) * p.vecs_per_token;
  return exec::sanitize<sizeof(T)>(row[vec]);
}

// Where a call stands, read once at its start: its deadline, its number, the word offsets of the buffer it
// writes into (current) and of the one it clears (previous), and its digest.
struct CallFrame {
  std::uint64_t deadline;
  std::uint32_t call;
  std::size_t cur;
  std::size_t prev;
  Vec16 digest;
};

FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, class Ctx>
FIAR_HD inline CallFrame begin_call(Ctx& ctx, const LamportParams<T>& p, std::uint32_t strategy) {
  const std::uint64_t deadline = ctx.now_ns() + p.timeout_ns;
  const std::uint32_t call = ctx.load_acquire(&p.state->call);
  const Vec16 digest{call & 0x7fffffffu, static_cast<std::uint32_t>(p.num_tokens), static_cast<std::uint32_t>(P),
                     strategy};
  return CallFrame{deadline, call, (call % kLamportBuffers) * p.buffer_words,
                   ((call + kLamportBuffers - 1) % kLamportBuffers) * p.buffer_words, digest};
}

// Pushes this rank's digest into slot [rank] of every rank's header (one lane of the grid does it).
FIAR_EXEC_CHECK_DISABLE
template <Transport X, ReduceType T, class Ctx>
FIAR_HD inline void push_digest(Ctx& ctx, const LamportParams<T>& p, const CallFrame& f) {
  if (p.verify && ctx.block() == 0 && ctx.lane() == 0) {
    store_to_all<X>(ctx, p, f.cur + static_cast<std::size_t>(p.rank) * exec::kWordsPerVec, f.digest);
  }
}

// Every lane reads the W digests of its buffer's header (kPollsInFlight at a time) and compares them with its own.
// Returns the site its polls use: failed (deadline 0) after a mismatch or a digest that never came, so that no wait
// follows and nothing it reduces is passed on. Every lane of a rank reads the same digests.
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD inline PollSite check_digests(Ctx& ctx, const LamportParams<T>& p, const CallFrame& f) {
  PollSite site{f.deadline, p.error, f.call};
  if (!p.verify) return site;
  const std::uint32_t* header = p.buffers[p.rank] + f.cur;
  bool ok = true;
  for (int r0 = 0; r0 < p.world_size && ok; r0 += kPollsInFlight) {
    Vec16 d[kPollsInFlight];
    if (load_batch(ctx, header, exec::kWordsPerVec, r0, p.world_size, d)) {
      const int n = p.world_size - r0 < kPollsInFlight ? p.world_size - r0 : kPollsInFlight;
      ok = wait_for_batch(ctx, header, exec::kWordsPerVec, r0, n, site);
      load_batch(ctx, header, exec::kWordsPerVec, r0, p.world_size, d);
    }
    FIAR_UNROLL
    for (int i = 0; i < kPollsInFlight; ++i) {
      if (ok && r0 + i < p.world_size &&
          (d[i].x != f.digest.x || d[i].y != f.digest.y || d[i].z != f.digest.z || d[i].w != f.digest.w)) {
        record_mismatch(ctx, p.error, r0 + i, d[i], f.digest);
        ok = false;
      }
    }
  }
  if (!ok) site.deadline = 0;
  return site;
}

}  // namespace detail

/// Lamport one-shot. Each rank stores its digest into slot [rank] of every rank's header, and its input into slot
/// [rank] of every rank's current buffer (W unicast stores, or one multicast store); it clears the buffer of the
/// previous call, checks the W digests, then polls the W slots of its own buffer and sums them in rank order in
/// fp32. Buffer layout: header [source rank], then [source rank][token][vector]. A token is reduced by one cluster.
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_oneshot(Ctx& ctx, const LamportParams<T>& p) {
  using namespace detail;
  const CallFrame f = begin_call<P>(ctx, p, kDigestOneShot);
  const std::size_t vecs = static_cast<std::size_t>(p.vecs_per_token);
  const std::size_t data = f.cur + header_words(p.world_size);
  const std::size_t rank_stride = static_cast<std::size_t>(p.num_tokens) * vecs * fiar::exec::kWordsPerVec;
  auto slot = [&](int source, int token, int vec) {
    return data + static_cast<std::size_t>(source) * rank_stride +
           (static_cast<std::size_t>(token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };

  // 1. Push this rank's digest and input to every rank, spread over every lane of the grid.
  push_digest<X>(ctx, p, f);
  const int total = p.num_tokens * p.vecs_per_token;
  for (int i = ctx.block() * ctx.lanes() + ctx.lane(); i < total; i += ctx.blocks() * ctx.lanes()) {
    const int t = i / p.vecs_per_token, v = i % p.vecs_per_token;
    store_to_all<X>(ctx, p, slot(p.rank, t, v), load_input(p, t, v));
  }

  // 2. Clear what the previous call wrote into this rank's buffer; peers write it again two calls from now.
  clear_previous(ctx, p, f.call, f.prev);

  // 3. Check the digests, poll and reduce in rank order (identical bits on every rank), then the epilogue.
  const PollSite site = check_digests(ctx, p, f);
  const exec::TokenSplit split = exec::token_split(ctx);
  for (int t = split.first_token; t < p.num_tokens; t += split.token_step) {
    finish_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token, [&](int v) {
      bool ok = true;
      const FloatPack<T> acc =
          reduce_slots<T>(ctx, p.buffers[p.rank] + slot(0, t, v), rank_stride, p.world_size, site, ok);
      return exec::sanitize<sizeof(T)>(pack<T>(acc));
    });
  }
  finish_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, f.call,
              static_cast<std::uint32_t>(header_words(p.world_size) +
                                         oneshot_words(p.world_size, p.num_tokens, p.vecs_per_token)));
}

/// Lamport two-shot. Tokens are split into W contiguous chunks; rank o owns chunk o. Each rank stores its digest
/// into every rank's header and its input for a token into the owner's scatter area (unicast); the owner checks the
/// digests, polls its W slots, sums them in rank order in fp32 and stores the rounded result into every rank's
/// gather area (W unicast stores, or one multicast store), spread over every lane of its grid; every rank polls its
/// gather area. An owner that is missing a contribution (or saw a mismatch) broadcasts nothing for it, so a late
/// rank waits and fails instead of taking a partial sum. Results are bit-identical to one-shot. Buffer layout:
/// header [source], scatter [source][chunk token][vector], then gather [token][vector].
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_twoshot(Ctx& ctx, const LamportParams<T>& p) {
  using namespace detail;
  const CallFrame f = begin_call<P>(ctx, p, kDigestTwoShot);
  const std::size_t vecs = static_cast<std::size_t>(p.vecs_per_token);
  const int chunk = twoshot_chunk(p.world_size, p.num_tokens);
  const std::size_t scatter_base = f.cur + header_words(p.world_size);
  const std::size_t rank_stride = static_cast<std::size_t>(chunk) * vecs * fiar::exec::kWordsPerVec;
  const std::size_t gather_base = scatter_base + static_cast<std::size_t>(p.world_size) * rank_stride;
  auto scatter_slot = [&](int source, int local_token, int vec) {
    return scatter_base + static_cast<std::size_t>(source) * rank_stride +
           (static_cast<std::size_t>(local_token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };
  auto gather_slot = [&](int token, int vec) {
    return gather_base + (static_cast<std::size_t>(token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };
  const int lane_id = ctx.block() * ctx.lanes() + ctx.lane();
  const int grid_lanes = ctx.blocks() * ctx.lanes();

  // 1. Scatter: the digest to every rank, each token's input to its owner.
  push_digest<X>(ctx, p, f);
  const int total = p.num_tokens * p.vecs_per_token;
  for (int i = lane_id; i < total; i += grid_lanes) {
    const int t = i / p.vecs_per_token, v = i % p.vecs_per_token;
    const int owner = t / chunk;
    ctx.store16(p.buffers[owner] + scatter_slot(p.rank, t - owner * chunk, v), load_input(p, t, v));
  }

  // 2. Clear the previous call's buffer.
  clear_previous(ctx, p, f.call, f.prev);

  // 3. Check the digests; reduce the owned chunk over every lane of the grid and broadcast what arrived whole.
  const PollSite site = check_digests(ctx, p, f);
  const int first = p.rank * chunk;
  const int owned = first >= p.num_tokens ? 0 : (first + chunk <= p.num_tokens ? chunk : p.num_tokens - first);
  for (int i = lane_id; i < owned * p.vecs_per_token; i += grid_lanes) {
    const int lt = i / p.vecs_per_token, v = i % p.vecs_per_token;
    bool ok = true;
    const FloatPack<T> acc =
        reduce_slots<T>(ctx, p.buffers[p.rank] + scatter_slot(0, lt, v), rank_stride, p.world_size, site, ok);
    if (ok) store_to_all<X>(ctx, p, gather_slot(first + lt, v), exec::sanitize<sizeof(T)>(pack<T>(acc)));
  }

  // 4. Gather: every token's result arrives from its owner; then the pattern's epilogue, a token per cluster.
  const exec::TokenSplit split = exec::token_split(ctx);
  for (int t = split.first_token; t < p.num_tokens; t += split.token_step) {
    const int owner = t / chunk;
    finish_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token,
                       [&](int v) { return poll(ctx, p.buffers[p.rank] + gather_slot(t, v), site, owner, true); });
  }
  finish_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, f.call,
              static_cast<std::uint32_t>(header_words(p.world_size) +
                                         twoshot_words(p.world_size, p.num_tokens, p.vecs_per_token)));
}

/// The operations of the Lamport protocols: their parameters are LamportParams<T>, their grid a cluster of blocks
/// per token (exec::spread_shape), and run() the protocol over transport X. Backends derive their named operations from
/// these (TrtllmOneShot, MnnvlTwoShot, ...), so that profiles show which backend ran.
template <Transport X, Pattern P, ReduceType T>
struct LamportOneShot : exec::PerTokenOperation<LamportParams<T>, P, T> {
  using Params = LamportParams<T>;
  static constexpr const char* name = "lamport one-shot";
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const Params& p) {
    lamport_oneshot<P, T, X>(ctx, p);
  }
};

template <Transport X, Pattern P, ReduceType T>
struct LamportTwoShot : LamportOneShot<X, P, T> {
  static constexpr const char* name = "lamport two-shot";
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const typename LamportOneShot<X, P, T>::Params& p) {
    lamport_twoshot<P, T, X>(ctx, p);
  }
};

}  // namespace algo
FIAR_END_NAMESPACE
