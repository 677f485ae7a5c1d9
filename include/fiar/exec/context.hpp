// SPDX-License-Identifier: Apache-2.0
// fiar/exec/context.hpp — what a kernel's logic may use of the machine it runs on (the ExecutionContext concept),
// the shape of a launch, and the multicast mapping as a kernel sees it.
// Contract: algo/ code touches memory other ranks use only through a context's 16-byte accesses and system-scope
// atomics; HostCtx (the emulator) and DeviceCtx (GPUs) both satisfy ExecutionContext with the same semantics.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "../core/prelude.hpp"
#include "vec.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// The group's multicast mapping of a region, as a kernel sees it. On the GPU a store through `address + offset`
/// lands at `offset` in every member's region (multimem.st). The host emulator has no switch: it performs that
/// replication itself, into `members` (each member's region, in rank order).
struct MulticastView {
  std::uint32_t* address = nullptr;         ///< GPU: the multicast mapping (null on the host emulator)
  std::uint32_t* const* members = nullptr;  ///< host emulator: where a multicast store lands
  int member_count = 0;
  std::uint32_t* stores = nullptr;  ///< host emulator: counts this rank's multicast stores (tests)
};

/// The element type of an in-switch reduction (multimem.ld_reduce): 4 floats, or 8 halves / bfloat16s accumulated
/// in fp32, in a 16-byte vector.
enum class ReduceKind { F32, F16, BF16 };

/// Vectors whose chunk sums one cluster holds for a token's canonical sum (token_sum_add / token_sum): at most
/// kMaxTokenChunks chunks of kTokenSumChunk consecutive vectors, i.e. 16,384 16-byte vectors (hidden_dim up to
/// 131,072 16-bit or 65,536 fp32 elements; validated at workspace creation).
inline constexpr int kTokenSumChunk = 32;
inline constexpr int kMaxTokenChunks = 512;
inline constexpr int kMaxTokenVecs = kTokenSumChunk * kMaxTokenChunks;

/// The canonical sum of a token's per-vector values q[0..vecs): the value every execution context's token_sum returns,
/// whatever the launch shape (blocks, lanes, clusters). Chunks of 32 consecutive vectors are summed by a butterfly
/// (pairs i, i ^ 16, then i ^ 8, ... i ^ 1; missing vectors count as +0), lane l of a final warp adds the chunk sums
/// l, l + 32, l + 64, ... in that order, and a last butterfly over those 32 partial sums gives the result. A fixed
/// function of `vecs` alone: a token's norm gets the same bits in a batch of any size, at any position, on any GPU
/// and on the host emulator. (The GPU computes it with shuffles; this is the reference, used by the emulator.)
FIAR_HD inline float butterfly_sum32(float (&x)[kTokenSumChunk]) {
  for (int m = kTokenSumChunk / 2; m > 0; m /= 2) {
    float y[kTokenSumChunk];
    for (int i = 0; i < kTokenSumChunk; ++i) y[i] = x[i] + x[i ^ m];
    for (int i = 0; i < kTokenSumChunk; ++i) x[i] = y[i];
  }
  return x[0];
}
FIAR_HD inline float canonical_token_sum(const float* q, int vecs) {
  const int chunks = (vecs + kTokenSumChunk - 1) / kTokenSumChunk;
  float partial[kTokenSumChunk] = {};
  for (int j = 0; j < chunks; ++j) {
    float x[kTokenSumChunk];
    for (int i = 0; i < kTokenSumChunk; ++i) {
      const int v = j * kTokenSumChunk + i;
      x[i] = v < vecs ? q[v] : 0.0f;
    }
    partial[j % kTokenSumChunk] += butterfly_sum32(x);
  }
  return butterfly_sum32(partial);
}

/// What a kernel's logic needs of the machine: its position (lane in the block, block in the grid, block in its
/// cluster), block-wide barrier (also as an "any lane" vote), sum and max, the same sums and maxima over a cluster of
/// blocks, a cluster barrier, a token's canonical sum over its cluster (token_sum_add per vector, then token_sum), the
/// largest value of a group of a token's consecutive vectors (group_max_add per vector, group_max_sync, group_max), a
/// clock and a back-off for bounded waits, 16-byte accesses and system-scope atomics on memory other ranks touch
/// (load16 / store16 carry the protocol's order; store16_weak only clears), and the multicast operations: a store
/// every member receives, a load that returns the members' values summed (the NVSwitch reduces), a system-scope
/// release add into every member's word, and the fence between unicast and multicast accesses.
template <class C>
concept ExecutionContext = requires(C& c, float x, const std::uint32_t* cp, std::uint32_t* p, std::uint32_t w,
                                    const Vec16& v, const MulticastView& view, std::size_t offset) {
  { c.lane() } -> std::convertible_to<int>;
  { c.lanes() } -> std::convertible_to<int>;
  { c.block() } -> std::convertible_to<int>;
  { c.blocks() } -> std::convertible_to<int>;
  c.sync();
  { c.sync_or(true) } -> std::convertible_to<bool>;
  c.cluster_sync();
  c.token_sum_add(0, x);
  { c.token_sum(0) } -> std::convertible_to<float>;
  c.group_max_add(0, x);
  c.group_max_sync();
  { c.group_max(0, x, 1) } -> std::convertible_to<float>;
  { c.sum(x) } -> std::convertible_to<float>;
  { c.max(x) } -> std::convertible_to<float>;
  { c.cluster_rank() } -> std::convertible_to<int>;
  { c.cluster_size() } -> std::convertible_to<int>;
  { c.cluster_index() } -> std::convertible_to<int>;
  { c.clusters() } -> std::convertible_to<int>;
  { c.cluster_sum(x) } -> std::convertible_to<float>;
  { c.cluster_max(x) } -> std::convertible_to<float>;
  { c.now_ns() } -> std::convertible_to<std::uint64_t>;
  c.pause();
  { c.load16(cp) } -> std::same_as<Vec16>;
  c.store16(p, v);
  c.store16_weak(p, v);
  c.multicast_store16(view, offset, v);
  { c.multicast_ld_reduce16(view, offset, ReduceKind::F32) } -> std::same_as<Vec16>;
  c.multicast_add_release(view, offset, w);
  c.fence_multicast();
  { c.load_relaxed(cp) } -> std::same_as<std::uint32_t>;
  { c.load_acquire(cp) } -> std::same_as<std::uint32_t>;
  c.store_relaxed(p, w);
  c.store_release(p, w);
  { c.fetch_add_acq_rel(p, w) } -> std::same_as<std::uint32_t>;
  { c.fetch_add_relaxed(p, w) } -> std::same_as<std::uint32_t>;
  { c.fetch_or_relaxed(p, w) } -> std::same_as<std::uint32_t>;
  c.fence_system();
};

/// Grid, block and cluster of one launch: `blocks` in the whole grid (a multiple of `cluster`), `threads` per block,
/// `cluster` blocks per thread-block cluster (1: no cluster).
struct LaunchShape {
  int blocks;
  int threads;
  int cluster = 1;
  friend constexpr bool operator==(const LaunchShape&, const LaunchShape&) = default;
};

/// What a platform lets one launch use.
struct LaunchLimits {
  int max_blocks = 1;  ///< most blocks per launch (CudaPlatform: its SM share; see CudaPlatformOptions::max_blocks)
};

/// Most blocks of one cluster fiar launches (the portable cluster size of sm_90 and sm_100).
inline constexpr int kMaxCluster = 8;

/// Blocks that share one token in a spread launch: the largest of 8, 4, 2, 1 that leaves every block at least 64
/// vectors of the token and the call at most 128 blocks in all. A function of the call alone (never of the GPU's
/// SM count), so every rank of a group reduces each token in the same order.
constexpr int token_cluster(int num_tokens, int vecs_per_token) {
  int c = kMaxCluster;
  while (c > 1 && (vecs_per_token / c < 64 || static_cast<long long>(num_tokens) * c > 128)) c /= 2;
  return c;
}

/// Most threads of a block of fiar's per-token operations: 512 leaves ptxas 128 registers per thread (one block per
/// SM), room for a poll that keeps 8 loads in flight without spilling; wider tokens loop (2+ vectors per lane).
inline constexpr int kMaxSpreadThreads = 512;

/// The launch of fiar's per-token operations: each token is handled by one cluster of token_cluster() blocks (its
/// vectors spread over them, the norm's sums combined across the cluster); as many clusters as tokens, at most
/// max_blocks blocks in all (at least one cluster; a cluster loops over tokens beyond that); threads a multiple of
/// 32 covering the cluster's share of one token (32 to kMaxSpreadThreads; a lane loops beyond). Outputs never
/// depend on it (the epilogue's sums are canonical).
constexpr LaunchShape spread_shape(int num_tokens, int vecs_per_token, int max_blocks) {
  const int cluster = token_cluster(num_tokens, vecs_per_token);
  const int share = (vecs_per_token + cluster - 1) / cluster;
  const int threads = std::clamp((share + 31) / 32 * 32, 32, kMaxSpreadThreads);
  const int clusters = std::max(1, std::min(num_tokens, max_blocks / cluster));
  return LaunchShape{clusters * cluster, threads, cluster};
}

/// Which tokens and vectors one lane handles in a spread launch: tokens first_token, + token_step, ...; within each,
/// vectors first_vec, + vec_step, ... The blocks of one cluster share a token.
struct TokenSplit {
  int first_token, token_step, first_vec, vec_step;
};
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_HD TokenSplit token_split(Ctx& ctx) {
  return TokenSplit{ctx.cluster_index(), ctx.clusters(), ctx.cluster_rank() * ctx.lanes() + ctx.lane(),
                    ctx.cluster_size() * ctx.lanes()};
}

}  // namespace exec
FIAR_END_NAMESPACE
