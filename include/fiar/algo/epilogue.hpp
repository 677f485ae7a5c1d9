// SPDX-License-Identifier: Apache-2.0
// fiar/algo/epilogue.hpp — what a protocol does with each reduced token: write it, or fuse the residual add, RMSNorm
// and FP8 / NVFP4 quantization that follow the all-reduce. Written once for every backend, driven by the pattern's
// row of core/pattern.hpp (norm, quantization).
// Contract: fp32 math with the rounding points listed in docs/design.md ("Fusion numerics"); a token is handled by
// one cluster of blocks (exec::token_split; cluster-wide sum/max from the context); outputs may alias inputs only as
// documented.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "convert.hpp"
#include "quant.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

struct MoeIndexError;  // algo/moe.hpp

/// One call as its kernels get it: the validated FusedArgs (in, out, num_tokens, the fused outputs and parameters;
/// unused members are null / ignored for a pattern), the norm's mean factor, and where a MoE finalize records a bad
/// index.
template <ReduceType T>
struct EpilogueParams : FusedArgs<T> {
  double inv_hidden = 0.0;  ///< 1 / hidden_dim in fp64 (the norm's mean: docs/design.md); 0: the kernel divides itself
  MoeIndexError* index_error = nullptr;  ///< MoE finalize: the workspace's record (null: not recorded)
  std::uint32_t moe_call = 0;            ///< MoE finalize: the call's number (1, 2, ...), what a record names
};

/// A call's kernel parameters; with hidden_dim, also the norm's 1 / hidden_dim (the backends pass it; without it
/// each norm kernel computes it itself, a fp64 division), and the record of bad MoE indices.
template <ReduceType T>
EpilogueParams<T> epilogue_params(const FusedArgs<T>& a, int hidden_dim = 0, MoeIndexError* index_error = nullptr,
                                  std::uint32_t moe_call = 0) {
  return EpilogueParams<T>{a, hidden_dim > 0 ? 1.0 / static_cast<double>(hidden_dim) : 0.0, index_error, moe_call};
}

/// One 16-byte vector as its elements (kElemsPerVec<T> of T): what a user epilogue reads and writes (EpilogueToken).
template <ReduceType T>
struct Elems {
  T e[kElemsPerVec<T>];
};

namespace detail {

// Vector `vec` of row `token`: a 32-bit vector index (a call's tensors are far below 2^32 vectors), so the address is
// one wide multiply-add.
FIAR_HD inline std::uint32_t row_vec(int token, int vecs_per_token, int vec) {
  return static_cast<std::uint32_t>(token) * static_cast<std::uint32_t>(vecs_per_token) +
         static_cast<std::uint32_t>(vec);
}
template <ReduceType T>
FIAR_HD inline Vec16 load_row(const T* base, int token, int vecs_per_token, int vec) {
  return reinterpret_cast<const Vec16*>(base)[row_vec(token, vecs_per_token, vec)];
}
template <ReduceType T>
FIAR_HD inline void store_row(T* base, int token, int vecs_per_token, int vec, const Vec16& v) {
  reinterpret_cast<Vec16*>(base)[row_vec(token, vecs_per_token, vec)] = v;
}

// By value: a Vec16 in registers. (From a reference into global memory, the memcpy compiled to 16 byte loads.)
template <ReduceType T>
FIAR_HD inline Elems<T> unpack(Vec16 v) {
  Elems<T> out;
  memcpy(static_cast<void*>(out.e), &v, sizeof(v));
  return out;
}
template <ReduceType T>
FIAR_HD inline Vec16 repack(const Elems<T>& e) {
  Vec16 v;
  memcpy(&v, static_cast<const void*>(e.e), sizeof(v));
  return v;
}

// The norm's mean ss / H, correctly rounded to fp32 for every normal quotient (an exact fp32 division's bits) without
// a division: fp64(ss) x fp64(1 / H) is within 2^-52 relative of ss / H, and for integer H <= 2^17 no normal fp32
// quotient lies that close to a rounding midpoint of fp32 (docs/design.md, "Fusion numerics"). The same fp64
// operations on both machines; no division routine (with its out-of-line slow path) in the kernel.
FIAR_HD inline float norm_mean(float ss, double inv_hidden) {
  return static_cast<float>(static_cast<double>(ss) * inv_hidden);
}

// The RMSNorm output element: T(y * s * (weight_bias + gamma)), evaluated left to right in fp32.
template <ReduceType T>
FIAR_HD inline T norm_elem(T y, float s, float weight_bias, T g) {
  return from_float<T>(to_float(y) * s * (weight_bias + to_float(g)));
}

// Vector `vec` of a norm's weights (gamma, gamma_pre).
template <ReduceType T>
FIAR_HD inline Vec16 weight_vec(const T* weights, int vec) {
  return reinterpret_cast<const Vec16*>(weights)[vec];
}

// `squares` plus the squares of v's elements, left to right in fp32 (a vector's step of the canonical sum).
template <ReduceType T>
FIAR_HD inline float add_squares(const Elems<T>& v, float squares) {
  FIAR_UNROLL
  for (int i = 0; i < kElemsPerVec<T>; ++i) {
    const float f = to_float(v.e[i]);
    squares = fma_rn(f, f, squares);
  }
  return squares;
}

// `gv`: gamma's vector for y (loaded early by a lane that owns one vector).
template <ReduceType T>
FIAR_HD inline Elems<T> norm_vec(const Vec16& y, float s, const EpilogueParams<T>& e, const Vec16& gv) {
  const Elems<T> yy = unpack<T>(y);
  const Elems<T> g = unpack<T>(gv);
  Elems<T> n;
  FIAR_UNROLL
  for (int i = 0; i < kElemsPerVec<T>; ++i) n.e[i] = norm_elem<T>(yy.e[i], s, e.weight_bias, g.e[i]);
  return n;
}

// Stores kElemsPerVec<T> e4m3 bytes (4 or 8) for one vector of a row.
template <ReduceType T>
FIAR_HD inline void store_fp8(std::uint8_t* row, int vec, const std::uint8_t* q) {
  constexpr int n = kElemsPerVec<T>;
  if constexpr (n == 8) {
    std::uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w |= static_cast<std::uint64_t>(q[i]) << (8 * i);
    *reinterpret_cast<std::uint64_t*>(row + static_cast<std::size_t>(vec) * 8) = w;
  } else {
    std::uint32_t w = 0;
    for (int i = 0; i < 4; ++i) w |= static_cast<std::uint32_t>(q[i]) << (8 * i);
    *reinterpret_cast<std::uint32_t*>(row + static_cast<std::size_t>(vec) * 4) = w;
  }
}

}  // namespace detail

/// Hands one reduced token to the pattern's epilogue. `fetch(v)` returns the token's reduced vector v (it
/// may poll); it is called exactly once per vector, by the lane that owns it (exec::token_split: the token's vectors
/// are spread over the blocks of one cluster). Every lane of the cluster calls it for the same token.
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, class Ctx, class Fetch>
FIAR_HD void finish_token(Ctx& ctx, T* out, const EpilogueParams<T>& e, int token, int vecs_per_token, Fetch&& fetch) {
  using namespace detail;
  constexpr PatternTraits kTraits = pattern_traits(P);
  constexpr int kE = kElemsPerVec<T>;
  const exec::TokenSplit split = exec::token_split(ctx);
  const int first = split.first_vec, step = split.vec_step;
  if constexpr (!kTraits.norm) {
    FIAR_NO_UNROLL
    for (int v = first; v < vecs_per_token; v += step) store_row(out, token, vecs_per_token, v, fetch(v));
  } else {
    // Residual add: y = T(sum + residual), the pre-norm output; the sum of squares of the rounded y in the canonical
    // order (exec::canonical_token_sum: per vector left to right, then a fixed tree over the token's vectors), so the
    // norm's bits depend on hidden_dim and dtype alone, never on the launch shape or the batch. Lanes walk the token
    // in runs of 32 consecutive vectors (a warp on the GPU: its lanes hold one chunk of the canonical sum). The
    // residual is loaded before the sum is fetched (which may wait); a lane that owns one vector keeps y in registers.
    // Without a residual (RmsNorm) y is the sum itself; a lane that owns several vectors stages it in norm_out, the
    // elements it then overwrites with the norm (the same lane, the same addresses: no other lane reads them). The
    // pre/post norm (ResidualRmsNormPrePost) normalizes the sum first (gamma_pre, y staged in norm_out, since
    // residual_out may alias residual_in), adds the residual to that, and normalizes the result (gamma): two canonical
    // sums per token.
    constexpr bool kResidual = kTraits.use[static_cast<int>(FusedTensor::ResidualIn)] != TensorUse::Unused;
    constexpr bool kPrePost = kTraits.use[static_cast<int>(FusedTensor::GammaPre)] != TensorUse::Unused;
    constexpr bool kAddFirst = kResidual && !kPrePost;
    const bool single = first < vecs_per_token && first + step >= vecs_per_token;
    T* const staged = kAddFirst ? e.residual_out : e.norm_out;
    const int sub = ctx.lane() % exec::kTokenSumChunk;
    Vec16 kept{};
    // A lane that owns one vector loads its gamma (weights: no earlier kernel writes them) before the sum is fetched,
    // so the load overlaps the poll instead of following the cluster's sum of squares.
    const Vec16 kept_gamma = single ? weight_vec(e.gamma, first) : Vec16{0, 0, 0, 0};
    FIAR_NO_UNROLL
    for (int v0 = first - sub; v0 < vecs_per_token; v0 += step) {
      const int v = v0 + sub;
      float squares = 0.0f;
      if (v < vecs_per_token) {
        Elems<T> y;
        if constexpr (kAddFirst) {
          const Vec16 rv = load_row(e.residual_in, token, vecs_per_token, v);
          const Elems<T> a = unpack<T>(fetch(v));
          const Elems<T> r = unpack<T>(rv);
          FIAR_UNROLL
          for (int i = 0; i < kE; ++i) y.e[i] = from_float<T>(to_float(a.e[i]) + to_float(r.e[i]));
        } else {
          y = unpack<T>(fetch(v));
        }
        squares = add_squares(y, squares);
        kept = repack<T>(y);
        if (kAddFirst || !single) store_row(staged, token, vecs_per_token, v, kept);
      }
      ctx.token_sum_add(v, squares);
    }
    const int hidden = vecs_per_token * kE;
    // The same fp64 value either way (1 / H rounded once), so the bits do not depend on who computed it.
    const double inv_hidden = e.inv_hidden != 0.0 ? e.inv_hidden : 1.0 / static_cast<double>(hidden);
    // The norm's scale from the token's canonical sum of squares (a cluster-wide reduction; the pre/post norm takes
    // two).
    auto norm_scale = [&] { return 1.0f / sqrtf(norm_mean(ctx.token_sum(vecs_per_token), inv_hidden) + e.eps); };
    float s = norm_scale();
    if constexpr (kPrePost) {
      // p = T(RMSNorm(y) with gamma_pre); z = T(p + residual_in), the residual out and the second norm's input.
      FIAR_NO_UNROLL
      for (int v0 = first - sub; v0 < vecs_per_token; v0 += step) {
        const int v = v0 + sub;
        float squares = 0.0f;
        if (v < vecs_per_token) {
          const Vec16 rv = load_row(e.residual_in, token, vecs_per_token, v);
          const Vec16 yv = single ? kept : load_row(staged, token, vecs_per_token, v);
          const Elems<T> p = norm_vec<T>(yv, s, e, weight_vec(e.gamma_pre, v));
          const Elems<T> r = unpack<T>(rv);
          Elems<T> z;
          FIAR_UNROLL
          for (int i = 0; i < kE; ++i) z.e[i] = from_float<T>(to_float(p.e[i]) + to_float(r.e[i]));
          squares = add_squares(z, squares);
          kept = repack<T>(z);
          store_row(e.residual_out, token, vecs_per_token, v, kept);
        }
        ctx.token_sum_add(v, squares);
      }
      s = norm_scale();
    }
    T* const normed = kPrePost ? e.residual_out : staged;  // what the (last) norm reads, for a lane of several vectors
    auto y_of = [&](int v) { return single ? kept : load_row(normed, token, vecs_per_token, v); };
    auto gamma_of = [&](int v) { return single ? kept_gamma : weight_vec(e.gamma, v); };

    if constexpr (kTraits.quant == Quant::None || kTraits.quant == Quant::Fp8Static) {
      const float inv_scale = kTraits.quant == Quant::Fp8Static ? 1.0f / *e.scale : 0.0f;
      std::uint8_t* qrow = static_cast<std::uint8_t*>(e.quant_out) + static_cast<std::size_t>(token) * hidden;
      for (int v = first; v < vecs_per_token; v += step) {
        const Elems<T> n = norm_vec<T>(y_of(v), s, e, gamma_of(v));
        if (e.norm_out != nullptr) store_row(e.norm_out, token, vecs_per_token, v, repack<T>(n));
        if constexpr (kTraits.quant == Quant::Fp8Static) {
          std::uint8_t q[kE];
          FIAR_UNROLL
          for (int i = 0; i < kE; ++i) q[i] = to_fp8_e4m3(to_float(n.e[i]) * inv_scale);
          store_fp8<T>(qrow, v, q);
        }
      }
    } else if constexpr (kTraits.quant == Quant::Fp8Dynamic) {
      float amax = 0.0f;
      for (int v = first; v < vecs_per_token; v += step) {
        const Elems<T> n = norm_vec<T>(y_of(v), s, e, gamma_of(v));
        if (e.norm_out != nullptr) store_row(e.norm_out, token, vecs_per_token, v, repack<T>(n));
        FIAR_UNROLL
        for (int i = 0; i < kE; ++i) amax = fmaxf(amax, fabsf(to_float(n.e[i])));
      }
      const float token_scale = fp8_dynamic_scale(ctx.cluster_max(amax));
      std::uint8_t* qrow = static_cast<std::uint8_t*>(e.quant_out) + static_cast<std::size_t>(token) * hidden;
      for (int v = first; v < vecs_per_token; v += step) {
        const Elems<T> n = norm_vec<T>(y_of(v), s, e, gamma_of(v));
        std::uint8_t q[kE];
        FIAR_UNROLL
        for (int i = 0; i < kE; ++i) q[i] = to_fp8_e4m3(to_float(n.e[i]) / token_scale);
        store_fp8<T>(qrow, v, q);
      }
      if (ctx.cluster_rank() == 0 && ctx.lane() == 0) e.scale_out[token] = token_scale;
    } else if constexpr (kTraits.quant == Quant::Fp8Group || kTraits.quant == Quant::Mxfp8) {
      // Per-token-group FP8: a group is group_size / kE consecutive vectors (a power of two up to 32, so on the GPU one
      // run of lanes of a warp: these loops advance a warp together, every lane calling group_max), its scale
      // fp8_group_scale of the group's largest |n|. The first loop hands each vector's largest |n| to the emulator,
      // which has no warps (on the GPU group_max_add is empty and the loop compiles to nothing); the second takes the
      // group's maximum, quantizes, and the lane of the group's first vector writes its scale. MXFP8 is the same walk
      // with groups of 32 elements and an e8m0 scale (mxfp8_scale) in the NVFP4 layouts.
      constexpr bool kMx = kTraits.quant == Quant::Mxfp8;
      const int group_vecs = kMx ? kMxfp8Block / kE : e.group_size / kE;
      int group_shift = 0;  // log2(group_vecs): the group of vector v is v >> group_shift (no integer division)
      while ((2 << group_shift) <= group_vecs) ++group_shift;
      auto largest = [](const Elems<T>& n) {
        float m = 0.0f;
        FIAR_UNROLL
        for (int i = 0; i < kE; ++i) m = fmaxf(m, fabsf(to_float(n.e[i])));
        return m;
      };
      FIAR_NO_UNROLL
      for (int v0 = first - sub; v0 < vecs_per_token; v0 += step) {
        const int v = v0 + sub;
        if (v < vecs_per_token) ctx.group_max_add(v, largest(norm_vec<T>(y_of(v), s, e, gamma_of(v))));
      }
      ctx.group_max_sync();
      const int groups = vecs_per_token >> group_shift;
      std::uint8_t* qrow = static_cast<std::uint8_t*>(e.quant_out) + static_cast<std::size_t>(token) * hidden;
      auto* scales = static_cast<std::uint8_t*>(e.block_scale_out);
      FIAR_NO_UNROLL
      for (int v0 = first - sub; v0 < vecs_per_token; v0 += step) {
        const int v = v0 + sub;
        const bool mine = v < vecs_per_token;
        Elems<T> n{};
        float amax = 0.0f;
        if (mine) {
          n = norm_vec<T>(y_of(v), s, e, gamma_of(v));
          if (e.norm_out != nullptr) store_row(e.norm_out, token, vecs_per_token, v, repack<T>(n));
          amax = largest(n);
        }
        const float group_max = ctx.group_max(v, amax, group_vecs);
        if (!mine) continue;
        float y = 0.0f, inv_y;  // n x (1 / y) is n / y exactly: y is a power of two
        std::uint8_t sf = 0;
        if constexpr (kMx) {
          sf = mxfp8_scale(group_max);
          inv_y = group_max != 0.0f ? e8m0_reciprocal(sf) : 0.0f;  // an all-zero block: zero codes
        } else {
          y = fp8_group_scale(group_max);
          inv_y = pow2_reciprocal(y);
        }
        std::uint8_t q[kE];
        FIAR_UNROLL
        for (int i = 0; i < kE; ++i) q[i] = to_fp8_e4m3(to_float(n.e[i]) * inv_y);
        store_fp8<T>(qrow, v, q);
        if ((v & (group_vecs - 1)) != 0) continue;
        const int g = v >> group_shift;
        if constexpr (kMx) {
          scales[block_scale_offset(token, g, groups, e.layout)] = sf;
          // The swizzled layout's padding columns of this row are zero.
          if (g == groups - 1 && e.layout == ScaleLayout::Swizzled128x4) {
            FIAR_NO_UNROLL
            for (int k = groups; k < round_up(groups, 4); ++k)
              scales[block_scale_offset(token, k, groups, e.layout)] = 0;
          }
          continue;
        }
        const std::size_t at = fp8_group_scale_offset(token, g, e.num_tokens, e.group_scale);
        if (e.group_scale == GroupScale::Float32) {
          *reinterpret_cast<float*>(scales + at) = y;
        } else {
          scales[at] = ue8m0_of(y);
          // The last pack's bytes past the last group are zero.
          if (g == groups - 1) {
            FIAR_NO_UNROLL
            for (int j = g % 4 + 1; j < 4; ++j) scales[at - g % 4 + j] = 0;
          }
        }
      }
    } else {
      static_assert(kTraits.quant == Quant::Nvfp4, "a pattern row names a quantization this epilogue has no math for");
      // One 16-element block = two vectors of 16-bit elements per lane. Float input is rejected on the
      // host before any launch; its instantiation compiles to nothing.
      if constexpr (kE == 8) {
        const float global = *e.scale;
        const int blocks16 = hidden / kNvfp4Block;
        const int padded = e.layout == ScaleLayout::Swizzled128x4 ? round_up(blocks16, 4) : blocks16;
        std::uint8_t* qrow = static_cast<std::uint8_t*>(e.quant_out) + static_cast<std::size_t>(token) * (hidden / 2);
        for (int u = first; u < padded; u += step) {
          const std::size_t at = nvfp4_scale_offset(token, u, hidden, e.layout);
          if (u >= blocks16) {  // padding column of the swizzled layout
            static_cast<std::uint8_t*>(e.block_scale_out)[at] = 0;
            continue;
          }
          float n[kNvfp4Block];
          float amax = 0.0f;
          for (int half = 0; half < 2; ++half) {
            const int v = 2 * u + half;
            const Elems<T> nv =
                norm_vec<T>(load_row(e.residual_out, token, vecs_per_token, v), s, e, weight_vec(e.gamma, v));
            if (e.norm_out != nullptr) store_row(e.norm_out, token, vecs_per_token, v, repack<T>(nv));
            FIAR_UNROLL
            for (int i = 0; i < kE; ++i) {
              n[half * kE + i] = to_float(nv.e[i]);
              amax = fmaxf(amax, fabsf(n[half * kE + i]));
            }
          }
          // FlashInfer's block scale: g x (amax x 1/6), the reciprocal a constant (docs/design.md, "NVFP4").
          const std::uint8_t sf = to_fp8_e4m3(global * (amax * kInvFp4Max));
          const float sf_value = from_fp8_e4m3(sf);
          const float factor = sf_value == 0.0f ? 0.0f : global / sf_value;
          std::uint64_t packed = 0;
          FIAR_UNROLL
          for (int i = 0; i < kNvfp4Block; i += 2) {
            packed |= static_cast<std::uint64_t>(to_fp4_e2m1x2(n[i] * factor, n[i + 1] * factor)) << (4 * i);
          }
          *reinterpret_cast<std::uint64_t*>(qrow + static_cast<std::size_t>(u) * 8) = packed;
          static_cast<std::uint8_t*>(e.block_scale_out)[at] = sf;
        }
      }
    }
  }
}

/// NVFP4 and MXFP8 swizzled layout: zero the padding rows [num_tokens, round_up(num_tokens, 128)) of the scale tensor,
/// spread over every lane of the grid, 16 bytes at a time. In the last 128-row tile a 16-byte line holds rows m, m +
/// 32, m + 64 and m + 96 of 4 columns: a line of padding rows only is one 16-byte store; a line that also holds real
/// rows gets a 4-byte store per padding row (the real rows' bytes are written with their rows). The padding columns
/// of real rows are written with their row.
///
/// Per-token-group FP8: zero the padding rows [num_tokens, round_up(num_tokens, 4)) of every scale column but the
/// last (which ends at row num_tokens: fp8_group_scale_bytes), 4 bytes each, spread over every lane of the grid.
FIAR_EXEC_CHECK_DISABLE
template <Pattern P, ReduceType T, class Ctx>
FIAR_HD void finish_call_outputs(Ctx& ctx, const EpilogueParams<T>& e, int num_tokens, int hidden) {
  if constexpr (pattern_traits(P).quant == Quant::Fp8Group) {
    const int rows = fp8_group_scale_rows(num_tokens);
    const int columns = fp8_group_scale_cols(hidden, e.group_size, e.group_scale) - 1;
    auto* words = static_cast<std::uint32_t*>(e.block_scale_out);
    FIAR_NO_UNROLL
    for (int c = ctx.block() * ctx.lanes() + ctx.lane(); c < columns; c += ctx.blocks() * ctx.lanes()) {
      FIAR_NO_UNROLL
      for (int t = num_tokens; t < rows; ++t)
        words[static_cast<std::size_t>(c) * static_cast<std::size_t>(rows) + t] = 0u;
    }
  }
  if constexpr (pattern_traits(P).quant == Quant::Nvfp4 || pattern_traits(P).quant == Quant::Mxfp8) {
    if (e.layout != ScaleLayout::Swizzled128x4 || num_tokens % 128 == 0) return;
    const int cols = pattern_traits(P).quant == Quant::Nvfp4 ? nvfp4_scale_cols(hidden) : mxfp8_scale_cols(hidden);
    const int k_tiles = round_up(cols, 4) / 4;
    const int tile = num_tokens / 128;  // the last row tile, partly padding
    const int real = num_tokens % 128;  // its real rows
    std::uint8_t* base = static_cast<std::uint8_t*>(e.block_scale_out) +
                         static_cast<std::size_t>(tile) * static_cast<std::size_t>(k_tiles) * 512;
    const int lines = k_tiles * 32;
    const int stride = ctx.blocks() * ctx.lanes();
    // The tensor needs only byte alignment: an unaligned one is zeroed byte by byte (the same bytes).
    const bool aligned = reinterpret_cast<std::uintptr_t>(base) % 16 == 0;
    for (int i = ctx.block() * ctx.lanes() + ctx.lane(); i < lines; i += stride) {
      std::uint8_t* line = base + static_cast<std::size_t>(i / 32) * 512 + static_cast<std::size_t>(i % 32) * 16;
      const int row = i % 32;  // rows row, row + 32, row + 64, row + 96 of the tile
      for (int q = row >= real ? 0 : 1; q < 4; ++q) {
        if (row + 32 * q < real) continue;
        if (aligned && q == 0) {  // every row of the line is padding
          *reinterpret_cast<Vec16*>(line) = Vec16{0, 0, 0, 0};
          break;
        }
        if (aligned) {
          *reinterpret_cast<std::uint32_t*>(line + 4 * q) = 0u;
        } else {
          for (int b = 0; b < 4; ++b) line[4 * q + b] = 0;
        }
      }
    }
  }
}

}  // namespace algo
FIAR_END_NAMESPACE
