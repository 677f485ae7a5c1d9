// SPDX-License-Identifier: Apache-2.0
// fiar/algo/epilogue_pass.hpp — the fused epilogue as a pass of its own, over a sum that is already reduced (the
// nccl backend: ncclAllReduce first, then this pass), and the operation (EpiloguePass) that launches it.
// Contract: the same per-token epilogue as the Lamport kernels (finish_token / finish_call_outputs), so the outputs
// are those of the trtllm and mnnvl backends given the same sum; a token is handled by one cluster of blocks.
#pragma once

#include <cstddef>

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

/// Everything one rank's epilogue pass needs for one call.
template <ReduceType T, class Epi = EpilogueParams<T>>
struct EpiloguePassParams {
  const T* sum;  ///< [num_tokens, hidden_dim]: the reduced all-reduce result (never aliases an output)
  T* out;        ///< Pattern::AllReduce only: where the sum is copied (the fused patterns ignore it)
  int num_tokens;
  int vecs_per_token;  ///< hidden_dim * sizeof(T) / 16
  Epi epi;             ///< the fused outputs (a user epilogue: its parameters; CallParams)
  /// MoE finalize patterns: non-null makes this launch the pass before the all-reduce, which writes this rank's
  /// contributions ([num_tokens, hidden_dim]) here instead of running the epilogue
  T* finalized = nullptr;
};

/// Cluster-strided over the tokens: each token's reduced vectors are read from `sum` and handed to the pattern's
/// epilogue (residual add, RMSNorm, FP8 / NVFP4 quantization); then the call-wide outputs (the padding rows of a
/// swizzled NVFP4 scale tensor). Every lane of every block must call it. A MoE finalize pattern's launch with
/// `finalized` set is the pass before the all-reduce instead: each token's contribution (algo/moe.hpp) into it.
FIAR_EXEC_CHECK_DISABLE
template <auto P, ReduceType T, class Ctx>
FIAR_HD void epilogue_pass(Ctx& ctx, const EpiloguePassParams<T, CallParams<P, T>>& p) {
  const exec::TokenSplit split = exec::token_split(ctx);
  if constexpr (epilogue_prologue<P>() == Prologue::MoeFinalize) {
    if (p.finalized != nullptr) {  // the finalize, before the all-reduce
      for (int t = split.first_token; t < p.num_tokens; t += split.token_step) {
        for (int v = split.first_vec; v < p.vecs_per_token; v += split.vec_step) {
          detail::store_row(p.finalized, t, p.vecs_per_token, v,
                            exec::sanitize<sizeof(T)>(moe_contribution<T>(ctx, p.epi, t, v, p.vecs_per_token)));
        }
      }
      return;
    }
  }
  for (int t = split.first_token; t < p.num_tokens; t += split.token_step) {
    const Vec16* row = reinterpret_cast<const Vec16*>(p.sum) + static_cast<std::size_t>(t) * p.vecs_per_token;
    epilogue_token<P, T>(ctx, p.out, p.epi, t, p.vecs_per_token, [row](int v) { return row[v]; });
  }
  epilogue_call_outputs<P, T>(ctx, p.epi, p.num_tokens, p.vecs_per_token * kElemsPerVec<T>);
}

/// The operation of the epilogue pass: the grid of the Lamport kernels (exec::spread_shape).
template <auto P, ReduceType T>
struct EpiloguePass : exec::PerTokenOperation<EpiloguePassParams<T, CallParams<P, T>>, P, T> {
  using Params = EpiloguePassParams<T, CallParams<P, T>>;
  static constexpr const char* name = "epilogue pass";
  static constexpr int min_arch = epilogue_min_arch<P>();  ///< NVFP4: sm_100 and newer
  FIAR_EXEC_CHECK_DISABLE
  template <class Ctx>
  FIAR_HD static void run(Ctx& ctx, const Params& p) {
    epilogue_pass<P, T>(ctx, p);
  }
};

}  // namespace algo
FIAR_END_NAMESPACE
