// SPDX-License-Identifier: Apache-2.0
// fiar/algo/moe.hpp — the MoE finalize the push phase runs before the all-reduce (Prologue::MoeFinalize): each token's
// contribution gathered from this rank's permuted expert output, weighted by the router, plus the shared expert.
// Contract: fp32 accumulation in k order with one rounding to T (docs/design.md, "MoE finalize"); an index outside [-1,
// num_permuted_rows) is never dereferenced: it counts as -1 and is recorded in MoeIndexError, which Workspace::check()
// reports.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "../exec/vec.hpp"
#include "convert.hpp"
#include "epilogue.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

/// Where a kernel records the first expanded_idx_to_permuted_idx entry outside [-1, num_permuted_rows) it met;
/// host-visible, read (and cleared) by Workspace::check().
struct MoeIndexError {
  /// Bit 0 set: claimed (a lane writes or wrote the record, not reported yet). Clear: free, and bits 1-31 the number
  /// of the last call reported (EpilogueParams::moe_call, 0 none), so that the same call never records twice.
  std::uint32_t claim;
  std::uint32_t token;  ///< where: expanded_idx_to_permuted_idx[token][k]
  std::uint32_t k;
  std::uint32_t value;  ///< the entry (an int32, as its bits)
  std::uint32_t rows;   ///< the call's num_permuted_rows
  std::uint32_t call;   ///< the recording call's EpilogueParams::moe_call (31 bits)
  std::uint32_t ready;  ///< 1 once the fields above are written, stored after a system fence; the host reads it first
};

/// Experts per batch of the finalize's loads: their indices, then their rows, are loaded together (in flight at once).
inline constexpr int kMoeBatch = 8;

namespace detail {

// A kernel's one system-scope fence, on its error paths only: what this lane recorded is visible to the host before
// `bits` are set in the host-visible word the host reads first. Out of line, and shared by every error record (the
// Lamport kernels' ErrorRecord, the MoE finalize's MoeIndexError), so that a kernel holds one copy of the fence.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_NOINLINE FIAR_HD void publish_bits(Ctx& ctx, std::uint32_t* word, std::uint32_t bits) {
  ctx.fence_system();
  ctx.fetch_or_relaxed(word, bits);
}

// Records a bad index (the first one of a call only): the claim picks one writer, which writes the fields, then
// publishes them (publish_bits sets `ready`), so that the host, which reads `ready` first (acquire), never sees them
// half-written, however it races the kernels. The host frees the claim once it reported the record, writing the
// reported call's number into it, possibly while that call's kernel runs on: a lane of that call then finds its own
// number in the word its claim returned, and frees it again instead of recording the call twice. Out of line: the
// loop carries the call alone.
FIAR_EXEC_CHECK_DISABLE
template <class Ctx>
FIAR_NOINLINE FIAR_HD void record_bad_index(Ctx& ctx, MoeIndexError* error, int token, int k, int value, int rows,
                                            std::uint32_t call) {
  if (error == nullptr) return;
  const std::uint32_t mine = call << 1;
  const std::uint32_t before = ctx.fetch_or_relaxed(&error->claim, 1u);
  if ((before & 1u) != 0) return;  // another lane's record, not reported yet
  if (before == mine) {            // this call's record was reported already: free again
    ctx.store_relaxed(&error->claim, mine);
    return;
  }
  ctx.store_relaxed(&error->call, call);
  ctx.store_relaxed(&error->rows, static_cast<std::uint32_t>(rows));
  ctx.store_relaxed(&error->token, static_cast<std::uint32_t>(token));
  ctx.store_relaxed(&error->k, static_cast<std::uint32_t>(k));
  ctx.store_relaxed(&error->value, static_cast<std::uint32_t>(value));
  publish_bits(ctx, &error->ready, 1u);
}

}  // namespace detail

/// Vector `vec` of this rank's contribution to token `token`: T(sum over k < top_k in order, skipping -1, of
/// fma(f(in[row_k][vec]), f32(expert_scale[token][k] x routed_scaling_factor), acc), plus f(shared_expert_out)), -0
/// kept as the caller's sanitize leaves it (+0). The indices of kMoeBatch experts are loaded first, then their rows,
/// so a batch's loads are in flight together.
FIAR_EXEC_CHECK_DISABLE
template <ReduceType T, class Ctx>
FIAR_HD exec::Vec16 moe_contribution(Ctx& ctx, const EpilogueParams<T>& e, int token, int vec, int vecs_per_token) {
  constexpr int kE = kElemsPerVec<T>;
  const std::size_t at = static_cast<std::size_t>(token) * static_cast<std::size_t>(e.top_k);
  const int* rows = e.expanded_idx_to_permuted_idx + at;
  const float* weights = e.expert_scale + at;
  float acc[kE] = {};
  FIAR_NO_UNROLL
  for (int k0 = 0; k0 < e.top_k; k0 += kMoeBatch) {
    int row[kMoeBatch];
    float w[kMoeBatch];
    FIAR_UNROLL
    for (int j = 0; j < kMoeBatch; ++j) {
      const bool expert = k0 + j < e.top_k;
      row[j] = expert ? rows[k0 + j] : -1;
      w[j] = expert ? weights[k0 + j] * e.routed_scaling_factor : 0.0f;
    }
    exec::Vec16 x[kMoeBatch];
    FIAR_UNROLL
    for (int j = 0; j < kMoeBatch; ++j) {
      const bool valid = row[j] >= 0 && row[j] < e.num_permuted_rows;
      if (!valid && row[j] != -1)
        detail::record_bad_index(ctx, e.index_error, token, k0 + j, row[j], e.num_permuted_rows, e.moe_call);
      row[j] = valid ? row[j] : -1;
      x[j] = valid ? detail::load_row(e.in, row[j], vecs_per_token, vec) : exec::Vec16{0, 0, 0, 0};
    }
    FIAR_UNROLL
    for (int j = 0; j < kMoeBatch; ++j) {
      if (row[j] < 0) continue;
      const auto xs = detail::unpack<T>(x[j]);
      FIAR_UNROLL
      for (int i = 0; i < kE; ++i) acc[i] = fma_rn(to_float(xs.e[i]), w[j], acc[i]);
    }
  }
  if (e.shared_expert_out != nullptr) {
    const auto s = detail::unpack<T>(detail::load_row(e.shared_expert_out, token, vecs_per_token, vec));
    FIAR_UNROLL
    for (int i = 0; i < kE; ++i) acc[i] = add_rn(acc[i], to_float(s.e[i]));
  }
  Elems<T> c;
  FIAR_UNROLL
  for (int i = 0; i < kE; ++i) c.e[i] = from_float<T>(acc[i]);
  return detail::repack<T>(c);
}

}  // namespace algo
FIAR_END_NAMESPACE
