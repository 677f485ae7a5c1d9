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
  std::uint32_t code;        ///< kErrorNone or kErrorTimeout
  std::uint32_t call;        ///< the call (LamportState::call) that timed out
  std::uint32_t missing[2];  ///< bit r of the 64-bit mask (word r / 32): data sent by rank r itself never arrived
  std::uint32_t stalled[2];  ///< bit r: a result rank r reduces (two-shot owner) never arrived
};
inline constexpr std::uint32_t kErrorNone = 0;
inline constexpr std::uint32_t kErrorTimeout = 1;

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
  EpilogueParams<T> epi;              ///< fused outputs (Pattern other than AllReduce)
};

/// Words a call of `tokens` tokens writes into one Lamport buffer.
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

FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void record_timeout(Ctx& ctx, ErrorRecord* error, int peer, bool relayed, std::uint32_t call) {
  std::uint32_t* mask = relayed ? error->stalled : error->missing;
  ctx.fetch_or_relaxed(mask + (peer >> 5), 1u << (peer & 31));
  ctx.store_relaxed(&error->call, call);
  ctx.store_release(&error->code, kErrorTimeout);
}

// Polls one Vec16 of this rank's buffer until no word is the sentinel, or the deadline passes. `peer` sent
// it; `relayed` when peer only forwards a result it reduced (two-shot), so its lateness may be another's.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline Vec16 poll(Ctx& ctx, const std::uint32_t* p, std::uint64_t deadline, ErrorRecord* error, int peer,
                          bool relayed, std::uint32_t call) {
  Vec16 v = ctx.load16(p);
  while (exec::has_sentinel(v)) {
    if (ctx.now_ns() > deadline) {
      record_timeout(ctx, error, peer, relayed, call);
      break;
    }
    ctx.pause();
    v = ctx.load16(p);
  }
  return v;
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

// Where a call stands, read once at its start: its deadline, its number, and the word offsets of the buffer it
// writes into (current) and of the one it clears (previous).
struct CallFrame {
  std::uint64_t deadline;
  std::uint32_t call;
  std::size_t cur;
  std::size_t prev;
};

FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD inline CallFrame begin_call(Ctx& ctx, const LamportParams<T>& p) {
  const std::uint64_t deadline = ctx.now_ns() + p.timeout_ns;
  const std::uint32_t call = ctx.load_acquire(&p.state->call);
  return CallFrame{deadline, call, (call % kLamportBuffers) * p.buffer_words,
                   ((call + kLamportBuffers - 1) % kLamportBuffers) * p.buffer_words};
}

}  // namespace detail

/// Lamport one-shot. Each rank stores its input into slot [rank] of every rank's current buffer (W unicast
/// stores, or one multicast store), clears the buffer of the previous call, then polls the W slots of its
/// own buffer and sums them in rank order in fp32. Buffer layout: [source rank][token][vector].
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_oneshot(Ctx& ctx, const LamportParams<T>& p) {
  using namespace detail;
  const auto [deadline, call, cur, prev] = begin_call(ctx, p);
  const std::size_t vecs = static_cast<std::size_t>(p.vecs_per_token);
  auto slot = [&](int source, int token, int vec) {
    return ((static_cast<std::size_t>(source) * p.num_tokens + token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };

  // 1. Push this rank's input to every rank.
  for (int t = ctx.block(); t < p.num_tokens; t += ctx.blocks()) {
    for (int v = ctx.lane(); v < p.vecs_per_token; v += ctx.lanes()) {
      store_to_all<X>(ctx, p, cur + slot(p.rank, t, v), load_input(p, t, v));
    }
  }

  // 2. Clear what the previous call wrote into this rank's buffer; peers write it again two calls from now.
  clear_previous(ctx, p, call, prev);

  // 3. Poll and reduce in rank order (identical bits on every rank), then the pattern's epilogue.
  for (int t = ctx.block(); t < p.num_tokens; t += ctx.blocks()) {
    finish_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token, [&](int v) {
      FloatPack<T> acc{};
      for (int r = 0; r < p.world_size; ++r) {
        const Vec16 y = poll(ctx, p.buffers[p.rank] + cur + slot(r, t, v), deadline, p.error, r, false, call);
        unpack_add<T>(y, acc);
      }
      return exec::sanitize<sizeof(T)>(pack<T>(acc));
    });
  }
  finish_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, call,
              static_cast<std::uint32_t>(oneshot_words(p.world_size, p.num_tokens, p.vecs_per_token)));
}

/// Lamport two-shot. Tokens are split into W contiguous chunks; rank o owns chunk o. Each rank stores its
/// input for a token into the owner's scatter area (unicast); the owner polls its W slots, sums them in
/// rank order in fp32 and stores the rounded result into every rank's gather area (W unicast stores, or
/// one multicast store); every rank polls its gather area. Results are bit-identical to one-shot. Buffer
/// layout: scatter [source][chunk token][vector], then gather [token][vector].
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_twoshot(Ctx& ctx, const LamportParams<T>& p) {
  using namespace detail;
  const auto [deadline, call, cur, prev] = begin_call(ctx, p);
  const std::size_t vecs = static_cast<std::size_t>(p.vecs_per_token);
  const int chunk = twoshot_chunk(p.world_size, p.num_tokens);
  const std::size_t gather_base = static_cast<std::size_t>(p.world_size) * chunk * vecs * fiar::exec::kWordsPerVec;
  auto scatter_slot = [&](int source, int local_token, int vec) {
    return ((static_cast<std::size_t>(source) * chunk + local_token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };
  auto gather_slot = [&](int token, int vec) {
    return gather_base + (static_cast<std::size_t>(token) * vecs + vec) * fiar::exec::kWordsPerVec;
  };

  // 1. Scatter: each token's input goes to its owner.
  for (int t = ctx.block(); t < p.num_tokens; t += ctx.blocks()) {
    const int owner = t / chunk;
    for (int v = ctx.lane(); v < p.vecs_per_token; v += ctx.lanes()) {
      ctx.store16(p.buffers[owner] + cur + scatter_slot(p.rank, t - owner * chunk, v), load_input(p, t, v));
    }
  }

  // 2. Clear the previous call's buffer.
  clear_previous(ctx, p, call, prev);

  // 3. Reduce the owned chunk and broadcast it.
  const int first = p.rank * chunk;
  const int owned = first >= p.num_tokens ? 0 : (first + chunk <= p.num_tokens ? chunk : p.num_tokens - first);
  for (int lt = ctx.block(); lt < owned; lt += ctx.blocks()) {
    for (int v = ctx.lane(); v < p.vecs_per_token; v += ctx.lanes()) {
      FloatPack<T> acc{};
      for (int r = 0; r < p.world_size; ++r) {
        const Vec16 y = poll(ctx, p.buffers[p.rank] + cur + scatter_slot(r, lt, v), deadline, p.error, r, false, call);
        unpack_add<T>(y, acc);
      }
      store_to_all<X>(ctx, p, cur + gather_slot(first + lt, v), exec::sanitize<sizeof(T)>(pack<T>(acc)));
    }
  }

  // 4. Gather: every token's result arrives from its owner; then the pattern's epilogue.
  for (int t = ctx.block(); t < p.num_tokens; t += ctx.blocks()) {
    const int owner = t / chunk;
    finish_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token, [&](int v) {
      return poll(ctx, p.buffers[p.rank] + cur + gather_slot(t, v), deadline, p.error, owner, true, call);
    });
  }
  finish_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, call,
              static_cast<std::uint32_t>(twoshot_words(p.world_size, p.num_tokens, p.vecs_per_token)));
}

/// The operations of the Lamport protocols: their parameters are LamportParams<T>, their grid one block per token
/// (per_token_shape), and run() the protocol over transport X. Backends derive their named operations from these
/// (TrtllmOneShot, MnnvlTwoShot, ...), so that profiles show which backend ran.
template <Transport X, Pattern P, ReduceType T>
struct LamportOneShot : exec::PerTokenOperation<LamportParams<T>, P, T> {
  using Params = LamportParams<T>;
  static constexpr const char* name = "lamport one-shot";
  // The multicast kernels promise one resident block per SM: with ptxas's default heuristics the two-shot
  // half/bf16 kernel spilled on sm_90a (scripts/ctx-cost checks every kernel).
  static constexpr int min_blocks_per_sm = X == Transport::Multicast ? 1 : 0;
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
