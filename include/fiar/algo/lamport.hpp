// SPDX-License-Identifier: Apache-2.0
// fiar/algo/lamport.hpp — the Lamport protocols of the trtllm and mnnvl backends, written once against an execution
// context and a transport, and the operations (LamportOneShot, LamportTwoShot) that launch them.
// Contract: lamport_oneshot and lamport_twoshot run unchanged on the GPU (DeviceCtx) and in the host emulator
// (HostCtx); every rank gets identical bits (fixed rank order, fp32); all state lives in the workspace, so the
// kernels are CUDA-graph safe; every wait ends by the deadline (a two-shot gather's a quarter of the timeout later),
// and at once once the workspace has failed. The transport only changes how a value reaches every
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
#include "moe.hpp"
#include "user_epilogue.hpp"

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

/// Protocol state of one rank, in that rank's (device) memory, advanced only by the kernels.
/// The first four words are read and written 16 bytes at a time (one load when a call begins, one store when it ends).
struct alignas(16) LamportState {
  std::uint32_t call;            ///< calls completed (wraps at 2^32; names calls in digests and errors only)
  std::uint32_t buffer;          ///< the buffer the next call uses, 0 to 2 (not call % 3: 2^32 is 1 mod 3)
  std::uint32_t arrived;         ///< blocks of the running call that have finished
  std::uint32_t reserved;        ///< 0 (finish_call's 16-byte store rewrites it)
  std::uint32_t dirty_words[3];  ///< words each buffer's last call wrote (cleared two calls later)
  /// The workspace's failure word: 0, or the code of its first failure (kError* bits), sticky. Every wait reads it
  /// every kSpinsPerCheck spins and ends once it is set, so the calls queued behind a failed one drain at once; the
  /// lane that sets it first alone writes the host-visible ErrorRecord. Device memory: waiting never reads host memory.
  std::uint32_t failed;
};

/// Where a kernel reports the workspace's first failure; host-visible, read by Workspace::check(). Written once, by
/// the lane that claimed LamportState::failed.
struct ErrorRecord {
  std::uint32_t code;        ///< kErrorNone, or kErrorTimeout or kErrorMismatch (bits; kErrorBarrier with a timeout)
  std::uint32_t call;        ///< the call (LamportState::call) that timed out
  std::uint32_t peer;        ///< kErrorMismatch: the rank whose call digest differs from this rank's
  std::uint32_t reserved;    ///< 0
  std::uint32_t missing[2];  ///< bit r of the 64-bit mask (word r / 32): data sent by rank r itself never arrived
  std::uint32_t stalled[2];  ///< bit r: a result rank r reduces (two-shot owner) never arrived
  std::uint32_t theirs[4];   ///< kErrorMismatch: its digest (CallDigest words)
  std::uint32_t mine[4];     ///< this rank's digest
};
static_assert(offsetof(ErrorRecord, theirs) % 16 == 0 && offsetof(ErrorRecord, mine) % 16 == 0,
              "the digests of a mismatch are stored 16 bytes at a time");
inline constexpr std::uint32_t kErrorNone = 0;
inline constexpr std::uint32_t kErrorTimeout = 1;
inline constexpr std::uint32_t kErrorMismatch = 2;
/// ErrorRecord::code bit, with kErrorTimeout: a multimem barrier timed out (some rank's cluster never arrived; the
/// barrier cannot tell which).
inline constexpr std::uint32_t kErrorBarrier = 4;

/// What every call tells its peers about itself, in the header of the Lamport buffer it uses: the call number
/// (31 bits), num_tokens, the pattern and the strategy that runs (1 one-shot, 2 two-shot, 3 in-switch, 4 the NCCL
/// route). No word is ever the sentinel.
struct CallDigest {
  std::uint32_t call, num_tokens, pattern, strategy;
  friend constexpr bool operator==(const CallDigest&, const CallDigest&) = default;
};
inline constexpr std::uint32_t kDigestOneShot = 1;
inline constexpr std::uint32_t kDigestTwoShot = 2;
inline constexpr std::uint32_t kDigestMultimem = 3;  ///< the in-switch reduction (algo/multimem.hpp)
/// A call the workspace hands to NCCL (Strategy::Nccl): its digest still goes through the Lamport buffers, in a
/// two-shot call of no tokens, so that a rank that runs the same call on the buffers meets it and both raise.
inline constexpr std::uint32_t kDigestNccl = 4;

/// What one rank's Lamport kernels get whatever the call computes: the group's buffers, the rank's state and error
/// record, the deadline, and the call's digest.
struct LamportLinks {
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
  /// What the call's digest says after its number (the kernel's), set by the engine per call: the call's num_tokens,
  /// epilogue code (epilogue_code) and kDigest* strategy. The NCCL route's digest exchange says the routed call's, with
  /// epi.num_tokens 0. 16-byte aligned: its last three words load as one 32-bit and one 64-bit constant into the
  /// registers of the 16-byte store that pushes it (unaligned, the kernels paid two moves).
  alignas(16) CallDigest digest;
};

/// Everything one rank's kernel needs for one call: the links, and the call (Epi: EpilogueParams<T> for a pattern,
/// UserCallParams for a user epilogue: CallParams).
template <ReduceType T, class Epi = EpilogueParams<T>>
struct LamportParams : LamportLinks {
  Epi epi;  ///< the call: in, out, num_tokens and the fused outputs (FusedArgs), or a user epilogue's parameters
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

/// Loads a poll keeps in flight: the W slots of a vector are loaded kPollBatch at a time (all of them for W <= 8),
/// and a batch is reissued whole while any word still holds the sentinel.
inline constexpr int kPollBatch = 8;

/// Spins of a wait between two looks at the workspace's failure word and the clock (stop_waiting): on the GPU the
/// check costs a device-memory load and a clock read only every 32 spins (about 15-30 us of waiting), never a
/// host-memory access. A context may set its own (Ctx::kSpinsPerCheck): the host emulator checks at every spin, since
/// each of its spins yields the CPU (milliseconds on a loaded machine).
inline constexpr std::uint32_t kSpinsPerCheck = 32;
template <class Ctx>
FIAR_HD constexpr std::uint32_t spins_per_check() {
  if constexpr (requires { Ctx::kSpinsPerCheck; }) {
    return Ctx::kSpinsPerCheck;
  } else {
    return kSpinsPerCheck;
  }
}

// Claims the workspace's first failure: true for the one lane (of any call and block) that sets the failure word
// first. Only that lane writes the host record, so a failure costs one record write and later calls none.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline bool claim_failure(Ctx& ctx, LamportState* state, std::uint32_t code) {
  return ctx.fetch_or_relaxed(&state->failed, code) == 0;
}

// Publishes `code` in the host record, after the fields this lane wrote (missing ranks, digests): publish_bits, the
// kernel's one system-scope fence.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void raise_code(Ctx& ctx, ErrorRecord* error, std::uint32_t code) {
  publish_bits(ctx, &error->code, code);
}

// Records a peer's call digest that differs from this rank's, if this is the workspace's first failure; every lane
// that sees one stops trusting the call, and every later wait of the workspace ends (the failure word).
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_NOINLINE FIAR_HD void record_mismatch(Ctx& ctx, const LamportLinks& p, int peer, Vec16 theirs, Vec16 mine) {
  ErrorRecord* const error = p.error;
  if (!claim_failure(ctx, p.state, kErrorMismatch)) return;
  ctx.store_relaxed(&error->peer, static_cast<std::uint32_t>(peer));
  ctx.store16(error->theirs, theirs);  // 16-byte aligned (ErrorRecord's static_assert)
  ctx.store16(error->mine, mine);
  raise_code(ctx, error, kErrorMismatch);
}

// Where a poll reads, and what it does when its data is late.
struct PollSite {
  std::uint64_t deadline;     ///< multimem barriers: 0, the call already failed here (do not wait, record nothing)
  const LamportLinks* links;  ///< the rank's state (failure word) and error record
  std::uint32_t call;
};

// Whether a wait ends now; a wait asks every kSpinsPerCheck spins (out of line: the hot loop carries the call only).
// It ends silently when the workspace has failed (its failure word: a timeout or a mismatch of any lane, this call or
// an earlier one; a mismatch is found by the lane whose data batch carries the peer's digest, compared as soon as it
// arrives, so every other wait of the rank ends at its next check) or, at a multimem barrier (kBarrier), when the call
// already failed here (deadline 0). Once the deadline passed (a relayed wait's: a quarter of the timeout later) it
// ends and, as the workspace's first failure, records a timeout naming the late ranks `late` << r0 (`relayed`: as
// owners of results; r0 % 32 + the mask's width stays within one word: r0 is a multiple of kPollBatch, or late is one
// bit), or at a barrier none (it cannot tell which).
FIAR_EXEC_CHECK_DISABLE
template <bool kBarrier = false, class Ctx>
FIAR_NOINLINE FIAR_HD bool stop_waiting(Ctx& ctx, PollSite site, int r0, std::uint32_t late, bool relayed) {
  const LamportLinks& p = *site.links;
  LamportState* const state = p.state;
  ErrorRecord* const error = p.error;
  if (ctx.load_relaxed(&state->failed) != 0) return true;
  if constexpr (kBarrier) {
    if (site.deadline == 0) return true;
  }
  // A relayed wait (a two-shot owner's result) gives up a quarter of the timeout later than the others, so that the
  // rank's own waits for data, which name the missing rank itself, record the failure first.
  if (ctx.now_ns() <= (relayed ? site.deadline + (p.timeout_ns >> 2) : site.deadline)) return false;
  const std::uint32_t code = kBarrier ? kErrorBarrier | kErrorTimeout : kErrorTimeout;
  if (claim_failure(ctx, state, code)) {
    if constexpr (!kBarrier) {
      ctx.store_relaxed((relayed ? error->stalled : error->missing) + (r0 >> 5), late << (r0 & 31));
    }
    ctx.store_relaxed(&error->call, site.call);
    raise_code(ctx, error, code);
  }
  return true;
}

// One 16-byte word of this rank's buffer, polled until no word is the sentinel; `peer` sent it (`relayed`: it only
// forwards a result it reduced, two-shot). Still holds a sentinel when the wait ended without it.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline Vec16 poll(Ctx& ctx, const std::uint32_t* p, const PollSite& site, int peer, bool relayed) {
  Vec16 v = ctx.load16(p);
  std::uint32_t spins = 0;
  while (exec::has_sentinel(v)) {
    if (++spins % spins_per_check<Ctx>() == 0 && stop_waiting(ctx, site, peer, 1u, relayed)) break;
    ctx.pause();
    v = ctx.load16(p);
  }
  return v;
}

// Bit i set: slot i of the batch holds a sentinel word (slots past the last rank hold zeros).
FIAR_HD inline std::uint32_t late_mask(const Vec16 (&y)[kPollBatch]) {
  std::uint32_t late = 0;
  FIAR_UNROLL
  for (int i = 0; i < kPollBatch; ++i) late |= (exec::has_sentinel(y[i]) ? 1u : 0u) << i;
  return late;
}

// The digests one poll checks along with its data batches: the slot in the header of the next one (rank `rank`), its
// value once loaded, and how many ranks on the one after it lies (0: none after this one).
struct DigestCheck {
  const std::uint32_t* at;  ///< null: nothing (more) to check
  Vec16 value;
  int rank;
  int step;
};

// Compares a digest that arrived with this rank's own; a mismatch is recorded (out of line) and fails the call here.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline bool digest_matches(Ctx& ctx, const LamportLinks& p, const DigestCheck& d, const Vec16& mine) {
  if (d.value.x == mine.x && d.value.y == mine.y && d.value.z == mine.z && d.value.w == mine.w) return true;
  record_mismatch(ctx, p, d.rank, d.value, mine);
  return false;
}

// The sum, in rank order in fp32, of the W slots `first + r * stride` (r = 0 .. W-1) of this rank's buffer. A batch of
// kPollBatch loads is issued back to back and reissued whole while any of its words holds the sentinel, so after the
// last peer's data lands one round trip follows. `digest` (if set) is loaded with the first batch, reissued with it
// while late, and compared as soon as it is there: a digest check costs no round trip of its own. Its next ones (ranks
// rank + step, + 2 step, ... below W) ride on the following batches, past the data if need be (batches without data
// slots add nothing). `ok` turns false when a slot did not arrive or a digest differs; at the deadline every rank
// still missing in the call is named.
// No element of the sum is -0, in fp32 or rounded to T, so no word of pack<T>(sum) is the sentinel and a two-shot
// owner can forward it as it is: the inputs are sanitized (never -0), the adds keep subnormals (add_rn), and every
// partial sum is a multiple of T's smallest subnormal u (exact while below 2^24 u, a multiple of its own ulp >= u
// above), so a non-zero sum is at least u in magnitude and rounds to a non-zero T; a zero sum is +0 (x + (-x) is +0
// when rounding to nearest, and the accumulator starts at +0).
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, bool kDigestWalk, class Ctx>
FIAR_HD inline FloatPack<T> reduce_slots(Ctx& ctx, const std::uint32_t* first, std::uint32_t stride, int world,
                                         const PollSite& site, bool& ok, DigestCheck& digest, const Vec16& mine) {
  FloatPack<T> acc{};
  // Slot addresses step by a 64-bit byte stride: one add per slot, no per-slot index arithmetic.
  const std::size_t step = static_cast<std::size_t>(stride) * sizeof(std::uint32_t);
  const char* batch = reinterpret_cast<const char*>(first);
  bool stopped = false;  // the wait ended without its data: later batches are read once
  std::uint32_t spins = 0;
  FIAR_NO_UNROLL
  for (int r0 = 0; r0 < world || (kDigestWalk && digest.at != nullptr); r0 += kPollBatch, batch += kPollBatch * step) {
    const int n = world - r0 < kPollBatch ? world - r0 : kPollBatch;  // <= 0: a batch that only carries a digest
    Vec16 y[kPollBatch];
    std::uint32_t late = 0;
    bool digest_late = false;
    for (;;) {  // the batch (and a pending digest) loaded together, again after each back-off
      const char* q = batch;
      FIAR_UNROLL
      for (int i = 0; i < kPollBatch; ++i, q += step) {
        y[i] = i < n ? ctx.load16(reinterpret_cast<const std::uint32_t*>(q)) : Vec16{0, 0, 0, 0};
      }
      if (digest.at != nullptr) digest.value = ctx.load16(digest.at);
      late = late_mask(y);
      digest_late = digest.at != nullptr && exec::has_sentinel(digest.value);
      if (digest.at != nullptr && !digest_late) {
        // Compared as soon as it is here, data or not: a differing call may never send the data this lane waits for.
        if (!digest_matches(ctx, *site.links, digest, mine)) {
          ok = false;
          stopped = true;
          digest.step = 0;
        }
        if constexpr (kDigestWalk) {  // the next one rides on the next batch
          digest.rank += digest.step;
          digest.at = digest.step != 0 && digest.rank < world
                          ? digest.at + static_cast<std::uint32_t>(digest.step) * exec::kWordsPerVec
                          : nullptr;
        } else {
          digest.at = nullptr;
        }
      }
      if ((late == 0 && !digest_late) || stopped) break;
      if (++spins % spins_per_check<Ctx>() == 0 &&
          stop_waiting(ctx, site, late != 0 ? r0 : digest.rank, late != 0 ? late : 1u, false)) {
        stopped = true;
        break;
      }
      ctx.pause();
    }
    if (late != 0 || digest_late) {
      ok = false;
      digest.at = nullptr;
    }
    FIAR_UNROLL  // in rank order; slots past the last rank hold +0 (the sum never is -0: inputs are sanitized)
        for (int i = 0; i < kPollBatch; ++i) unpack_add<T>(y[i], acc);
  }
  return acc;
}

// Overwrites the first `words` words of a buffer with the sentinel, spread over every lane of the grid, with plain
// (weak) stores and no fence: nobody reads or writes this buffer in this call, and peers write it again only after
// this rank's next call has pushed (which they must see first), behind this kernel's end and the next one's
// griddepcontrol.wait.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void clear(Ctx& ctx, std::uint32_t* buffer, std::uint32_t words) {
  // 32-bit indices: the backend keeps a region below 2^32 words.
  const auto stride = static_cast<std::uint32_t>(ctx.lanes() * ctx.blocks()) * exec::kWordsPerVec;
  auto i = static_cast<std::uint32_t>(ctx.block() * ctx.lanes() + ctx.lane()) * exec::kWordsPerVec;
  FIAR_NO_UNROLL
  for (; i < words; i += stride) ctx.store16_weak(buffer + i, exec::sentinel_vec());
}

// Where a call stands, read once at its start: its deadline, its number, the buffer it writes into (index and word
// offset), the one it clears (the previous call's), and its digest.
struct CallFrame {
  std::uint64_t deadline;
  std::uint32_t call;
  std::uint32_t buffer;  ///< 0 to 2
  std::uint32_t cur;     ///< word offsets in the region: 32 bits (the backend keeps the region below 2^32 words)
  std::uint32_t prev;
  std::uint32_t prev_buffer;
  Vec16 digest;
};

// Clears what the previous call wrote into this rank's buffer (peers write it again two calls from now).
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void clear_previous(Ctx& ctx, const LamportLinks& p, const CallFrame& f) {
  clear(ctx, p.buffers[p.rank] + f.prev, ctx.load_relaxed(&p.state->dirty_words[f.prev_buffer]));
}

// The last block to finish publishes the next state: the buffer rotation, the call number and the size to clear.
// Relaxed: no peer reads the state, and this rank's next kernel reads it after griddepcontrol.wait, which orders it
// after this grid's completion.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void finish_call(Ctx& ctx, LamportState* state, const CallFrame& f, std::uint32_t used_words) {
  ctx.sync();
  if (ctx.lane() == 0) {
    const std::uint32_t before = ctx.fetch_add_relaxed(&state->arrived, 1u);
    if (before + 1 == static_cast<std::uint32_t>(ctx.blocks())) {
      ctx.store_relaxed(&state->dirty_words[f.buffer], used_words);
      // call, buffer, arrived (back to 0) and the reserved word in one 16-byte store
      ctx.store16(&state->call, Vec16{f.call + 1, f.buffer + 1 == kLamportBuffers ? 0u : f.buffer + 1, 0u, 0u});
    }
  }
}

// Stores v at word `offset` of every rank's region: through the multicast mapping (one store), or one unicast store
// per rank in rank order (the first kPollBatch unrolled, so each buffer pointer is a constant-bank operand).
FIAR_EXEC_CHECK_DISABLE
template <Transport X, class Ctx>
FIAR_HD inline void store_to_all(Ctx& ctx, const LamportLinks& p, std::uint32_t offset, const Vec16& v) {
  if constexpr (X == Transport::Multicast) {
    ctx.multicast_store16(p.multicast, offset, v);
  } else {
    // A 64-bit byte offset: each store's address is one add to a constant-bank pointer.
    const std::size_t bytes = static_cast<std::size_t>(offset) * sizeof(std::uint32_t);
    auto at = [&](int r) { return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(p.buffers[r]) + bytes); };
    FIAR_UNROLL
    for (int r = 0; r < kPollBatch; ++r) {
      if (r < p.world_size) ctx.store16(at(r), v);
    }
    FIAR_NO_UNROLL
    for (int r = kPollBatch; r < p.world_size; ++r) ctx.store16(at(r), v);
  }
}

// Vector `vec` of this rank's contribution to token `token`: its input row, or the MoE finalize of its expert rows.
FIAR_EXEC_CHECK_DISABLE
template <auto P, ReduceType T, class Epi, class Ctx>
FIAR_HD inline Vec16 load_input(Ctx& ctx, const LamportParams<T, Epi>& p, int token, int vec) {
  if constexpr (epilogue_prologue<P>() == Prologue::MoeFinalize) {
    return exec::sanitize<sizeof(T)>(moe_contribution<T>(ctx, p.epi, token, vec, p.vecs_per_token));
  } else {
    // 32-bit vector index (a call's input is far below 2^32 vectors), one wide multiply-add for the address.
    const auto i = static_cast<std::uint32_t>(token) * static_cast<std::uint32_t>(p.vecs_per_token) +
                   static_cast<std::uint32_t>(vec);
    return exec::sanitize<sizeof(T)>(reinterpret_cast<const Vec16*>(p.epi.in)[i]);
  }
}

FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline CallFrame begin_call(Ctx& ctx, const LamportLinks& p) {
  const std::uint64_t deadline = ctx.now_ns() + p.timeout_ns;
  // Relaxed: written by this rank's previous kernel, which griddepcontrol.wait has seen complete.
  const Vec16 head = ctx.load16(&p.state->call);  // call, buffer, arrived, reserved
  const std::uint32_t call = head.x;
  const std::uint32_t buffer = head.y;
  const std::uint32_t prev = buffer == 0 ? kLamportBuffers - 1 : buffer - 1;
  const Vec16 digest{call & 0x7fffffffu, p.digest.num_tokens, p.digest.pattern, p.digest.strategy};
  const auto words = static_cast<std::uint32_t>(p.buffer_words);
  return CallFrame{deadline, call, buffer, buffer * words, prev * words, prev, digest};
}

// Pushes this rank's digest into slot [rank] of every rank's header (one lane of the grid does it).
FIAR_EXEC_CHECK_DISABLE
template <Transport X, class Ctx>
FIAR_HD inline void push_digest(Ctx& ctx, const LamportLinks& p, const CallFrame& f) {
  if (p.verify && ctx.block() == 0 && ctx.lane() == 0) {
    const std::uint32_t at = f.cur + static_cast<std::uint32_t>(p.rank) * exec::kWordsPerVec;
    if constexpr (X == Transport::Multicast) {
      ctx.multicast_store16(p.multicast, at, f.digest);
    } else {
      FIAR_NO_UNROLL
      for (int r = 0; r < p.world_size; ++r) ctx.store16(p.buffers[r] + at, f.digest);
    }
  }
}

// The digest this lane checks first (lane g of the grid checks rank g, then g + grid lanes, ...), or none.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline DigestCheck first_digest(Ctx& ctx, const LamportLinks& p, const CallFrame& f) {
  const int g = ctx.block() * ctx.lanes() + ctx.lane();
  if (!p.verify || g >= p.world_size) return DigestCheck{nullptr, Vec16{0, 0, 0, 0}, 0, 0};
  return DigestCheck{p.buffers[p.rank] + f.cur + static_cast<std::uint32_t>(g) * exec::kWordsPerVec, Vec16{0, 0, 0, 0},
                     g, 0};
}

// Polls the digests of ranks from, from + step, ... (below W) in this rank's header and compares each with `mine`;
// false when one differs or never came (each recorded; after the first failure the waits end at once). Out of line:
// the Lamport protocols call it only for digests no data batch carried (a lane without data, or more ranks than grid
// lanes), a cold path at decode sizes; the in-switch reduction checks every digest with it before its barriers.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_NOINLINE FIAR_HD bool check_digest_range(Ctx& ctx, const std::uint32_t* header, int world, Vec16 mine,
                                              PollSite site, int from, int step) {
  bool ok = true;
  FIAR_NO_UNROLL
  for (int r = from; r < world; r += step) {
    const std::uint32_t* at = header + static_cast<std::uint32_t>(r) * exec::kWordsPerVec;
    const Vec16 d = poll(ctx, at, site, r, false);
    if (exec::has_sentinel(d) || !digest_matches(ctx, *site.links, DigestCheck{at, d, r, 0}, mine)) ok = false;
  }
  return ok;
}

// The digests this lane has left to check after its data: its pending one (no data batch carried it), and those of
// ranks beyond the grid's lanes.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline void finish_digests(Ctx& ctx, const LamportLinks& p, const CallFrame& f, const PollSite& site,
                                   const DigestCheck& pending) {
  const int lanes = ctx.blocks() * ctx.lanes();
  if (p.verify && (pending.at != nullptr || p.world_size > lanes)) {
    const int g = ctx.block() * ctx.lanes() + ctx.lane();
    check_digest_range(ctx, p.buffers[p.rank] + f.cur, p.world_size, f.digest, site,
                       pending.at != nullptr ? g : g + lanes, lanes);
  }
}

// Every lane reads all W digests of its buffer's header and compares them with its own (the in-switch reduction,
// whose barriers must not start on a mismatch). Returns the site its waits use: failed (deadline 0) after a mismatch
// or a digest that never came, so that no wait follows.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD inline PollSite check_digests(Ctx& ctx, const LamportLinks& p, const CallFrame& f) {
  PollSite site{f.deadline, &p, f.call};
  if (p.verify && !check_digest_range(ctx, p.buffers[p.rank] + f.cur, p.world_size, f.digest, site, 0, 1)) {
    site.deadline = 0;
  }
  return site;
}

}  // namespace detail

/// Lamport one-shot. Each rank stores its digest into slot [rank] of every rank's header, and its input into slot
/// [rank] of every rank's current buffer (W unicast stores, or one multicast store); it clears the buffer of the
/// previous call, then polls the W slots of its own buffer (element e of the call carrying the digests of ranks e,
/// e + E, ... in its batches) and sums them in rank order in fp32. Buffer layout: header [source rank], then
/// [source rank][token][vector]. A token is reduced by one cluster; each lane pushes exactly the vectors it polls.
FIAR_EXEC_CHECK_DISABLE
template <auto P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_oneshot(Ctx& ctx, const LamportParams<T, CallParams<P, T>>& p) {
  using namespace detail;
  const CallFrame f = begin_call(ctx, p);
  const auto vecs = static_cast<std::uint32_t>(p.vecs_per_token);
  const std::uint32_t data = f.cur + static_cast<std::uint32_t>(header_words(p.world_size));
  const std::uint32_t rank_stride = static_cast<std::uint32_t>(p.epi.num_tokens) * vecs * fiar::exec::kWordsPerVec;
  auto slot = [&](int source, int token, int vec) {
    return data + static_cast<std::uint32_t>(source) * rank_stride +
           (static_cast<std::uint32_t>(token) * vecs + static_cast<std::uint32_t>(vec)) * fiar::exec::kWordsPerVec;
  };
  const exec::TokenSplit split = exec::token_split(ctx);

  // 1. Push this rank's digest and input to every rank: each lane the vectors it will reduce.
  push_digest<X>(ctx, p, f);
  FIAR_NO_UNROLL
  for (int t = split.first_token; t < p.epi.num_tokens; t += split.token_step) {
    FIAR_NO_UNROLL
    for (int v = split.first_vec; v < p.vecs_per_token; v += split.vec_step) {
      store_to_all<X>(ctx, p, slot(p.rank, t, v), load_input<P>(ctx, p, t, v));
    }
  }

  // 2. Clear what the previous call wrote into this rank's buffer.
  clear_previous(ctx, p, f);

  // 3. Poll and reduce in rank order (identical bits on every rank), then the epilogue. The digests ride on the data:
  //    element e (token t, vector v: e = t x vecs + v) checks the digests of ranks e, e + E, e + 2E, ... below W (E:
  //    the call's elements), so every rank's digest is checked by exactly one element, whatever the shape.
  const PollSite site{f.deadline, &p, f.call};
  const std::uint32_t* const header = p.buffers[p.rank] + f.cur;
  const auto elements = static_cast<std::uint32_t>(p.epi.num_tokens) * vecs;
  FIAR_NO_UNROLL
  for (int t = split.first_token; t < p.epi.num_tokens; t += split.token_step) {
    epilogue_token<P, T>(ctx, p.epi.out, p.epi, t, p.vecs_per_token, [&](int v) {
      const std::uint32_t e = static_cast<std::uint32_t>(t) * vecs + static_cast<std::uint32_t>(v);
      DigestCheck digest{nullptr, Vec16{0, 0, 0, 0}, static_cast<int>(e), static_cast<int>(elements)};
      if (p.verify && e < static_cast<std::uint32_t>(p.world_size)) digest.at = header + e * exec::kWordsPerVec;
      bool ok = true;
      const FloatPack<T> acc = reduce_slots<T, true>(ctx, p.buffers[p.rank] + slot(0, t, v), rank_stride, p.world_size,
                                                     site, ok, digest, f.digest);
      return pack<T>(acc);  // no element is -0 (reduce_slots)
    });
  }
  epilogue_call_outputs<P, T>(ctx, p.epi, p.epi.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, f,
              static_cast<std::uint32_t>(header_words(p.world_size) +
                                         oneshot_words(p.world_size, p.epi.num_tokens, p.vecs_per_token)));
}

/// Lamport two-shot. Tokens are split into W contiguous chunks; rank o owns chunk o. Each rank stores its digest
/// into every rank's header and its input for a token into the owner's scatter area (unicast); the owner polls its W
/// slots (the first W lanes checking one digest each in the same batch), sums them in rank order in fp32 and stores
/// the rounded result into every rank's gather area (W unicast stores, or one multicast store), spread over every
/// lane of its grid; every rank polls its gather area. An owner that is missing a contribution (or saw a mismatch)
/// broadcasts nothing for it, so a late rank waits and fails instead of taking a partial sum. Results are
/// bit-identical to one-shot. Buffer layout: header [source], scatter [source][chunk token][vector], then gather
/// [token][vector].
FIAR_EXEC_CHECK_DISABLE
template <auto P, ReduceType T, Transport X = Transport::Unicast, class Ctx>
FIAR_HD void lamport_twoshot(Ctx& ctx, const LamportParams<T, CallParams<P, T>>& p) {
  using namespace detail;
  const CallFrame f = begin_call(ctx, p);
  const auto vecs = static_cast<std::uint32_t>(p.vecs_per_token);
  const int chunk = twoshot_chunk(p.world_size, p.epi.num_tokens);
  const std::uint32_t scatter_base = f.cur + static_cast<std::uint32_t>(header_words(p.world_size));
  const std::uint32_t rank_stride = static_cast<std::uint32_t>(chunk) * vecs * fiar::exec::kWordsPerVec;
  const std::uint32_t gather_base = scatter_base + static_cast<std::uint32_t>(p.world_size) * rank_stride;
  auto scatter_slot = [&](int source, int local_token, int vec) {
    return scatter_base + static_cast<std::uint32_t>(source) * rank_stride +
           (static_cast<std::uint32_t>(local_token) * vecs + static_cast<std::uint32_t>(vec)) *
               fiar::exec::kWordsPerVec;
  };
  auto gather_slot = [&](int token, int vec) {
    return gather_base +
           (static_cast<std::uint32_t>(token) * vecs + static_cast<std::uint32_t>(vec)) * fiar::exec::kWordsPerVec;
  };
  const int lane_id = ctx.block() * ctx.lanes() + ctx.lane();
  const int grid_lanes = ctx.blocks() * ctx.lanes();

  // 1. Scatter: the digest to every rank, each token's input to its owner (owner and token walked without division).
  //    A lane with nothing to scatter skips the setup too (a call of no tokens, the NCCL route's digest exchange,
  //    has chunk 0).
  push_digest<X>(ctx, p, f);
  const int total = p.epi.num_tokens * p.vecs_per_token;
  if (lane_id < total) {
    int t = lane_id / p.vecs_per_token, v = lane_id - t * p.vecs_per_token;
    const int dt = grid_lanes / p.vecs_per_token, dv = grid_lanes - dt * p.vecs_per_token;
    int owner = t / chunk, local = t - owner * chunk;
    FIAR_NO_UNROLL
    for (int i = lane_id; i < total; i += grid_lanes) {
      ctx.store16(p.buffers[owner] + scatter_slot(p.rank, local, v), load_input<P>(ctx, p, t, v));
      v += dv;
      t += dt;
      local += dt;
      if (v >= p.vecs_per_token) {
        v -= p.vecs_per_token;
        ++t;
        ++local;
      }
      while (local >= chunk) {
        local -= chunk;
        ++owner;
      }
    }
  }

  // 2. Clear the previous call's buffer.
  clear_previous(ctx, p, f);

  // 3. Reduce the owned chunk over every lane of the grid and broadcast what arrived whole (the first batch of the
  //    first W lanes carrying their digest checks).
  const PollSite site{f.deadline, &p, f.call};
  DigestCheck digest = first_digest(ctx, p, f);
  const int first = p.rank * chunk;
  const int owned =
      first >= p.epi.num_tokens ? 0 : (first + chunk <= p.epi.num_tokens ? chunk : p.epi.num_tokens - first);
  {
    int lt = lane_id / p.vecs_per_token, v = lane_id - lt * p.vecs_per_token;
    const int dt = grid_lanes / p.vecs_per_token, dv = grid_lanes - dt * p.vecs_per_token;
    FIAR_NO_UNROLL
    for (int i = lane_id; i < owned * p.vecs_per_token; i += grid_lanes) {
      bool ok = true;
      const FloatPack<T> acc = reduce_slots<T, false>(ctx, p.buffers[p.rank] + scatter_slot(0, lt, v), rank_stride,
                                                      p.world_size, site, ok, digest, f.digest);
      if (ok) store_to_all<X>(ctx, p, gather_slot(first + lt, v), pack<T>(acc));  // no -0: never the sentinel
      v += dv;
      lt += dt;
      if (v >= p.vecs_per_token) {
        v -= p.vecs_per_token;
        ++lt;
      }
    }
  }
  finish_digests(ctx, p, f, site, digest);

  // 4. Gather: every token's result arrives from its owner; then the pattern's epilogue, a token per cluster.
  const exec::TokenSplit split = exec::token_split(ctx);
  FIAR_NO_UNROLL
  for (int t = split.first_token; t < p.epi.num_tokens; t += split.token_step) {
    const int owner = t / chunk;
    epilogue_token<P, T>(ctx, p.epi.out, p.epi, t, p.vecs_per_token,
                         [&](int v) { return poll(ctx, p.buffers[p.rank] + gather_slot(t, v), site, owner, true); });
  }
  epilogue_call_outputs<P, T>(ctx, p.epi, p.epi.num_tokens, p.vecs_per_token * kElemsPerVec<T>);

  finish_call(ctx, p.state, f,
              static_cast<std::uint32_t>(header_words(p.world_size) +
                                         twoshot_words(p.world_size, p.epi.num_tokens, p.vecs_per_token)));
}

/// The operations of the Lamport protocols: their parameters are LamportParams (with the call of P: CallParams), their
/// grid a cluster of blocks per token (exec::spread_shape), and run() the protocol over transport X. Backends derive
/// their named operations from these (TrtllmOneShot, MnnvlTwoShot, ...), so that profiles show which backend ran.
template <Transport X, auto P, ReduceType T>
struct LamportOneShot : exec::PerTokenOperation<LamportParams<T, CallParams<P, T>>, P, T> {
  using Params = LamportParams<T, CallParams<P, T>>;
  static constexpr const char* name = "lamport one-shot";
  static constexpr int min_arch = epilogue_min_arch<P>();  ///< NVFP4: sm_100 and newer
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const Params& p) {
    lamport_oneshot<P, T, X>(ctx, p);
  }
};

template <Transport X, auto P, ReduceType T>
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
