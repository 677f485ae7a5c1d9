// SPDX-License-Identifier: Apache-2.0
// The plain C++ reference of the fused epilogues (residual add + RMSNorm, static and dynamic FP8, NVFP4 with
// swizzled and linear scales), shared by the host-emulator tests (test/unit/test_fusion.cpp, test_backends.cpp and
// the backends' own) and the GPU tests (test/gpu/test_gpu_fusion.cpp): the caller runs a pattern on every rank,
// gathers each rank's outputs into Outputs<T>, and check_pattern() compares them with the reference (fp64 where the
// kernel's reduction order is free, bit for bit where it is not). Uses Catch2 assertions: call it from the test's own
// thread.
#pragma once

#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference.hpp"

namespace fiar_test {

// How pattern P uses tensor t, from its row of fiar's pattern table (the tests allocate and check what the row says,
// not a list of patterns).
template <fiar::Pattern P>
constexpr bool uses(fiar::FusedTensor t) {
  return fiar::pattern_traits(P).use[static_cast<int>(t)] != fiar::TensorUse::Unused;
}
template <fiar::Pattern P>
constexpr bool requires_tensor(fiar::FusedTensor t) {
  return fiar::pattern_traits(P).use[static_cast<int>(t)] == fiar::TensorUse::Required;
}

inline std::uint8_t fp8(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
inline float fp8_value(std::uint8_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3)));
}
inline std::uint8_t fp4(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xf);
}

// The swizzled 128x4 offset, restated from the layout's definition.
inline std::size_t swizzled_offset(int m, int k, int cols) {
  const int k_tiles = (cols + 3) / 4;
  return static_cast<std::size_t>(m / 128) * k_tiles * 512 + static_cast<std::size_t>(k / 4) * 512 + (m % 32) * 16 +
         ((m % 128) / 32) * 4 + (k % 4);
}

struct Shape {
  int world, tokens, hidden;
};

// How a call lays out its quantized outputs: NVFP4's scale layout; per-token-group FP8's group size (0: 128 elements
// where it divides hidden_dim, else the largest allowed that does) and scale format.
struct QuantOptions {
  fiar::ScaleLayout layout = fiar::ScaleLayout::Swizzled128x4;
  int group_size = 0;
  fiar::GroupScale group_scale = fiar::GroupScale::Ue8m0Packed;

  // The MoE finalize's inputs (moe_inputs): experts per token, a shared expert, the routed scaling factor.
  int top_k = 8;
  bool shared = true;
  float routed_scaling_factor = 1.0f;

  QuantOptions() = default;
  QuantOptions(fiar::ScaleLayout l) : layout(l) {}  // NOLINT(google-explicit-constructor): call sites pass a layout
  QuantOptions(int g, fiar::GroupScale f) : group_size(g), group_scale(f) {}
  static QuantOptions moe(int k, bool with_shared, float rsf = 1.0f) {
    QuantOptions q;
    q.top_k = k;
    q.shared = with_shared;
    q.routed_scaling_factor = rsf;
    return q;
  }
};

// One rank's MoE finalize inputs and what it contributes to the all-reduce. `in` has tokens x top_k + 3 rows (the
// last 3 padding, never referenced); token t's k-th expert is row (t x top_k + k) x 7 mod (tokens x top_k), or -1
// (none) where (t + 2k + rank) % 5 == 0; the weights are multiples of 1/8. The contribution, restated from the
// definition: per element, acc = fma(x_k, f32(w_k x rsf), acc) over the experts in k order, + shared, one rounding
// to T, -0 as +0.
template <class T>
struct MoeInputs {
  int rows = 0;
  std::vector<T> in, shared, contribution;
  std::vector<int> idx;
  std::vector<float> scale;
};
template <class T>
MoeInputs<T> moe_inputs(int tokens, int hidden, int rank, const QuantOptions& q) {
  MoeInputs<T> m;
  const int k_n = q.top_k, used = tokens * k_n;
  m.rows = used + 3;
  m.in = make_input<T>(static_cast<std::size_t>(m.rows) * hidden, rank, 7, false);
  if (q.shared) m.shared = make_input<T>(static_cast<std::size_t>(tokens) * hidden, rank + 50, 8, false);
  m.idx.resize(static_cast<std::size_t>(used));
  m.scale.resize(static_cast<std::size_t>(used));
  for (int t = 0; t < tokens; ++t) {
    for (int k = 0; k < k_n; ++k) {
      const std::size_t i = static_cast<std::size_t>(t) * k_n + k;
      m.idx[i] = (t + 2 * k + rank) % 5 == 0 ? -1 : static_cast<int>((i * 7) % static_cast<std::size_t>(used));
      m.scale[i] = 0.125f * static_cast<float>(1 + (3 * t + k + rank) % 7);
    }
  }
  m.contribution.resize(static_cast<std::size_t>(tokens) * hidden);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < hidden; ++h) {
      float acc = 0.0f;
      for (int k = 0; k < k_n; ++k) {
        const std::size_t i = static_cast<std::size_t>(t) * k_n + k;
        if (m.idx[i] < 0) continue;
        const float w = m.scale[i] * q.routed_scaling_factor;
        acc = std::fma(as_float(m.in[static_cast<std::size_t>(m.idx[i]) * hidden + h]), w, acc);
      }
      if (q.shared) acc += as_float(m.shared[static_cast<std::size_t>(t) * hidden + h]);
      T c = from_float<T>(acc);
      if (is_negative_zero(c)) c = from_float<T>(0.0f);
      m.contribution[static_cast<std::size_t>(t) * hidden + h] = c;
    }
  }
  return m;
}

// The group size a call of element type T over `hidden` uses (QuantOptions::group_size resolved).
template <class T>
int group_size_for(const QuantOptions& q, int hidden) {
  if (q.group_size > 0) return q.group_size;
  const int per_vec = static_cast<int>(16 / sizeof(T));
  int g = per_vec;
  while (g * 2 <= 128 && g * 2 <= 32 * per_vec && hidden % (g * 2) == 0) g *= 2;
  return g;
}

// The exponent of the smallest power of two at or above y > 0 (frexp: y = m x 2^e with m in [0.5, 1); a power of two
// when m = 0.5).
inline int pow2_exponent_at_or_above(float y) {
  int e = 0;
  return std::frexp(y, &e) == 0.5f ? e - 1 : e;
}

// The per-token-group FP8 scale, restated from its definition: the smallest power of two at or above
// max(amax / 448, 1e-10).
inline float group_scale_of(float amax) {
  return std::ldexp(1.0f, pow2_exponent_at_or_above(std::max(amax / 448.0f, 1e-10f)));
}

// The MXFP8 block scale byte, restated: the exponent of the smallest power of two at or above amax / 448 (fp32),
// biased by 127; 0 for an all-zero block.
inline std::uint8_t mxfp8_scale_of(float amax) {
  if (amax == 0.0f) return 0;
  // below 2^-127: rounded up to it
  return static_cast<std::uint8_t>(std::max(0, pow2_exponent_at_or_above(amax / 448.0f) + 127));
}

// The group-scale tensor of a call, restated: the scale of (token t, group g) at Float32 element g x rows + t, or
// byte g % 4 of int32 element (g / 4) x rows + t (its biased exponent), rows = tokens rounded up to 4.
inline std::size_t group_scale_at(int t, int g, int tokens, fiar::GroupScale f) {
  const std::size_t rows = static_cast<std::size_t>((tokens + 3) / 4 * 4);
  return f == fiar::GroupScale::Float32 ? 4 * (g * rows + t) : 4 * (g / 4 * rows + t) + g % 4;
}
inline float group_scale_read(const std::vector<std::uint8_t>& buf, int t, int g, int tokens, fiar::GroupScale f) {
  const std::size_t at = group_scale_at(t, g, tokens, f);
  if (f == fiar::GroupScale::Float32) {
    float y;
    std::memcpy(&y, buf.data() + at, sizeof(y));
    return y;
  }
  return std::ldexp(1.0f, static_cast<int>(buf[at]) - 127);
}

// What every rank produced for one call.
template <class T>
struct Outputs {
  std::vector<T> out, residual_out, norm_out;
  std::vector<std::uint8_t> quant, block_scales;
  std::vector<float> scale_out;
};

template <class T>
std::vector<T> residual_of(std::size_t count, int call) {
  return make_input<T>(count, 1000, call, false);
}
// Norm weights: base + step x ((i x stride) mod period) / (period - 1), exact in every T.
template <class T>
std::vector<T> weights_of(int hidden, float base, float step, int stride, int period) {
  std::vector<T> g(static_cast<std::size_t>(hidden));
  for (int i = 0; i < hidden; ++i) {
    g[static_cast<std::size_t>(i)] =
        from_float<T>(base + step * static_cast<float>((i * stride) % period) / static_cast<float>(period - 1));
  }
  return g;
}
template <class T>
std::vector<T> gamma_of(int hidden) {
  return weights_of<T>(hidden, 0.5f, 0.25f, 7, 9);
}
// The first norm's weights of the pre/post norm (ResidualRmsNormPrePost): other values than gamma_of's.
template <class T>
std::vector<T> gamma_pre_of(int hidden) {
  return weights_of<T>(hidden, 0.75f, 0.125f, 5, 7);
}

// Checks that every rank's outputs are bit-identical to rank 0's, and rank 0's against the reference.
template <fiar::Pattern P, class T>
void check_pattern(const Shape& s, const std::vector<Outputs<T>>& outs, bool with_norm_out, const QuantOptions& quant,
                   float weight_bias, float scale) {
  const fiar::ScaleLayout layout = quant.layout;
  const int group = group_size_for<T>(quant, s.hidden);
  const int groups = s.hidden / group;
  // The group-scale tensor as the reference writes it (padding zero), filled per token below.
  std::vector<std::uint8_t> group_scales;
  if constexpr (P == fiar::Pattern::ResidualRmsNormFp8Group) {
    group_scales.assign(fiar::algo::fp8_group_scale_bytes(s.tokens, s.hidden, group, quant.group_scale), 0);
  }
  int far_group = 0;
  const std::size_t count = static_cast<std::size_t>(s.tokens) * s.hidden;
  auto same_bits = [](const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [](T x, T y) { return bits(x) == bits(y); });
  };
  for (std::size_t r = 1; r < outs.size(); ++r) {
    CAPTURE(r);
    CHECK(same_bits(outs[r].out, outs[0].out));
    CHECK(same_bits(outs[r].residual_out, outs[0].residual_out));
    CHECK(same_bits(outs[r].norm_out, outs[0].norm_out));
    CHECK(outs[r].quant == outs[0].quant);
    CHECK(outs[r].block_scales == outs[0].block_scales);
    CHECK(outs[r].scale_out == outs[0].scale_out);
  }
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < s.world; ++r) {
    if constexpr (fiar::pattern_traits(P).prologue == fiar::Prologue::MoeFinalize) {
      inputs.push_back(moe_inputs<T>(s.tokens, s.hidden, r, quant).contribution);
    } else {
      inputs.push_back(make_input<T>(count, r, 0, false));
    }
  }
  const std::vector<T> sum = rank_order_sum(inputs, count);
  const Outputs<T>& o = outs[0];
  int mismatches = 0;
  if constexpr (!fiar::pattern_traits(P).norm) {  // AllReduce, MoeFinalizeAllReduce: the sum, bit for bit
    for (std::size_t i = 0; i < count; ++i) mismatches += bits(o.out[i]) != bits(sum[i]);
    CHECK(mismatches == 0);
    return;
  } else {
    const std::vector<T> residual = residual_of<T>(count, 0);
    const std::vector<T> gamma = gamma_of<T>(s.hidden);
    const double ulp = unit_roundoff<T>() * 2;
    constexpr bool kResidual = uses<P>(fiar::FusedTensor::ResidualIn);
    constexpr bool kPrePost = uses<P>(fiar::FusedTensor::GammaPre);
    const std::vector<T> gamma_pre = gamma_pre_of<T>(s.hidden);
    CHECK(o.residual_out.empty() == !kResidual);
    int far_pre = 0;
    for (int t = 0; t < s.tokens; ++t) {
      // Residual add: bit-exact (one fp32 add, one rounding); RmsNorm normalizes the sum itself; the pre/post norm
      // adds the residual to the first norm of the sum (checked within the norm's bound; the second norm then starts
      // from the kernel's residual_out).
      std::vector<T> y(static_cast<std::size_t>(s.hidden));
      double squares = 0;
      double pre_inv_rms = 0;
      if constexpr (kPrePost) {
        double ss = 0;
        for (int h = 0; h < s.hidden; ++h) {
          const double x = as_float(sum[static_cast<std::size_t>(t) * s.hidden + h]);
          ss += x * x;
        }
        pre_inv_rms = 1.0 / std::sqrt(ss / s.hidden + 1e-5);
      }
      for (int h = 0; h < s.hidden; ++h) {
        const std::size_t i = static_cast<std::size_t>(t) * s.hidden + h;
        if constexpr (kPrePost) {
          const double p =
              as_float(sum[i]) * pre_inv_rms * (weight_bias + as_float(gamma_pre[static_cast<std::size_t>(h)]));
          const double got = as_float(o.residual_out[i]), want = p + as_float(residual[i]);
          if (std::fabs(got - want) >
              ulp * (std::fabs(p) + std::fabs(got)) + 1e-6 * std::fabs(p) + 2 * error_bound<T>(0.0, 0.0, 1))
            ++far_pre;
          y[static_cast<std::size_t>(h)] = o.residual_out[i];
        } else {
          y[static_cast<std::size_t>(h)] = kResidual ? from_float<T>(as_float(sum[i]) + as_float(residual[i])) : sum[i];
          if (kResidual) mismatches += bits(o.residual_out[i]) != bits(y[static_cast<std::size_t>(h)]);
        }
        squares +=
            static_cast<double>(as_float(y[static_cast<std::size_t>(h)])) * as_float(y[static_cast<std::size_t>(h)]);
      }
      const double inv_rms = 1.0 / std::sqrt(squares / s.hidden + 1e-5);
      // The kernel's norm output (or the reference's, when it wrote none), checked within one ulp of T plus
      // the fp32 error of the mean of squares.
      std::vector<float> n(static_cast<std::size_t>(s.hidden));
      int far = 0;
      for (int h = 0; h < s.hidden; ++h) {
        const std::size_t i = static_cast<std::size_t>(t) * s.hidden + h;
        const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                            (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]));
        if (!o.norm_out.empty()) {
          const double got = as_float(o.norm_out[i]);
          // Plus one subnormal step of T: near zero an ulp is absolute (half: 2^-24), not relative.
          if (std::fabs(got - want) > ulp * std::fabs(want) + 1e-6 * std::fabs(want) + error_bound<T>(0.0, 0.0, 1))
            ++far;
          n[static_cast<std::size_t>(h)] = as_float(o.norm_out[i]);
        }
      }
      CHECK(far == 0);
      CHECK(o.norm_out.empty() == !(with_norm_out || requires_tensor<P>(fiar::FusedTensor::NormOut)));
      if (o.norm_out.empty()) {
        // Without norm_out, the FP8 codes are checked against the reference norm: within one e4m3 step
        // (2^-3 relative, 2^-9 absolute near zero) plus one rounding of T.
        if constexpr (P == fiar::Pattern::ResidualRmsNormFp8) {
          int off = 0;
          for (int h = 0; h < s.hidden; ++h) {
            const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                (weight_bias + as_float(gamma[static_cast<std::size_t>(h)])) / scale;
            const double got = fp8_value(o.quant[static_cast<std::size_t>(t) * s.hidden + h]);
            const double capped = std::max(-448.0, std::min(448.0, want));
            if (std::fabs(got - capped) > (0.125 + ulp) * std::fabs(capped) + std::ldexp(1.0, -9)) ++off;
          }
          CHECK(off == 0);
        }
        if constexpr (P == fiar::Pattern::ResidualRmsNormFp8Group) {
          // The kernel's scale is the reference's or one power of two off (its norm may round the group's largest
          // element to the other side of a power of two), and the codes dequantize to the reference norm within one
          // e4m3 step plus one rounding of T (2^-9 of the scale absolute, near zero).
          for (int k = 0; k < groups; ++k) {
            double amax = 0;
            for (int j = 0; j < group; ++j) {
              const int h = k * group + j;
              amax = std::max(amax, std::fabs(as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                              (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]))));
            }
            const float got_y = group_scale_read(o.block_scales, t, k, s.tokens, quant.group_scale);
            const float want_y = group_scale_of(static_cast<float>(amax));
            if (!(got_y == want_y || got_y == 2 * want_y || 2 * got_y == want_y)) ++far_group;
            for (int j = 0; j < group; ++j) {
              const int h = k * group + j;
              const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                  (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]));
              const double got = fp8_value(o.quant[static_cast<std::size_t>(t) * s.hidden + h]) * got_y;
              if (std::fabs(got - want) > (0.125 + ulp) * std::fabs(want) + std::ldexp(1.0, -9) * got_y) ++far_group;
            }
          }
        }
        if constexpr (P == fiar::Pattern::ResidualRmsNormMxfp8) {
          // As for the groups: the block's scale the reference's or one power of two off, the codes within one e4m3
          // step of the reference norm.
          const int cols = s.hidden / 32;
          for (int k = 0; k < cols; ++k) {
            double amax = 0;
            for (int j = 0; j < 32; ++j) {
              const int h = k * 32 + j;
              amax = std::max(amax, std::fabs(as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                              (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]))));
            }
            const std::size_t at = layout == fiar::ScaleLayout::Linear ? static_cast<std::size_t>(t) * cols + k
                                                                       : swizzled_offset(t, k, cols);
            const int got_sf = o.block_scales[at], want_sf = mxfp8_scale_of(static_cast<float>(amax));
            if (std::abs(got_sf - want_sf) > 1) ++far_group;
            const float y_k = std::ldexp(1.0f, got_sf - 127);
            for (int j = 0; j < 32; ++j) {
              const int h = k * 32 + j;
              const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                  (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]));
              const double got = fp8_value(o.quant[static_cast<std::size_t>(t) * s.hidden + h]) * y_k;
              if (std::fabs(got - want) > (0.125 + ulp) * std::fabs(want) + std::ldexp(1.0, -9) * y_k) ++far_group;
            }
          }
        }
        continue;  // the exact checks below use the kernel's own norm values
      }
      if constexpr (P == fiar::Pattern::ResidualRmsNormFp8) {
        for (int h = 0; h < s.hidden; ++h) {
          mismatches += o.quant[static_cast<std::size_t>(t) * s.hidden + h] !=
                        fp8(n[static_cast<std::size_t>(h)] * (1.0f / scale));
        }
      } else if constexpr (P == fiar::Pattern::ResidualRmsNormFp8Dynamic) {
        float amax = 0;
        for (float x : n) amax = std::max(amax, std::fabs(x));
        const float token_scale = std::max(amax / 448.0f, 1.0f / (512.0f * 448.0f));
        CHECK(o.scale_out[static_cast<std::size_t>(t)] == token_scale);
        for (int h = 0; h < s.hidden; ++h) {
          mismatches +=
              o.quant[static_cast<std::size_t>(t) * s.hidden + h] != fp8(n[static_cast<std::size_t>(h)] / token_scale);
        }
      } else if constexpr (P == fiar::Pattern::ResidualRmsNormFp8Group) {
        for (int k = 0; k < groups; ++k) {
          float amax = 0;
          for (int j = 0; j < group; ++j) amax = std::max(amax, std::fabs(n[static_cast<std::size_t>(k * group + j)]));
          const float y_k = group_scale_of(amax);
          const std::size_t at = group_scale_at(t, k, s.tokens, quant.group_scale);
          if (quant.group_scale == fiar::GroupScale::Float32) {
            std::memcpy(group_scales.data() + at, &y_k, sizeof(y_k));
          } else {
            group_scales[at] = static_cast<std::uint8_t>(std::ilogb(y_k) + 127);
          }
          for (int j = 0; j < group; ++j) {
            const int h = k * group + j;
            mismatches +=
                o.quant[static_cast<std::size_t>(t) * s.hidden + h] != fp8(n[static_cast<std::size_t>(h)] / y_k);
          }
        }
      } else if constexpr (P == fiar::Pattern::ResidualRmsNormMxfp8) {
        const int cols = s.hidden / 32;
        for (int k = 0; k < cols; ++k) {
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(n[static_cast<std::size_t>(k * 32 + j)]));
          const std::uint8_t sf = mxfp8_scale_of(amax);
          const std::size_t at = layout == fiar::ScaleLayout::Linear ? static_cast<std::size_t>(t) * cols + k
                                                                     : swizzled_offset(t, k, cols);
          mismatches += o.block_scales[at] != sf;
          const float factor = amax == 0.0f ? 0.0f : std::ldexp(1.0f, 127 - sf);
          for (int j = 0; j < 32; ++j) {
            const int h = k * 32 + j;
            mismatches +=
                o.quant[static_cast<std::size_t>(t) * s.hidden + h] != fp8(n[static_cast<std::size_t>(h)] * factor);
          }
        }
      } else if constexpr (P == fiar::Pattern::ResidualRmsNormNvfp4) {
        const int cols = s.hidden / 16;
        for (int k = 0; k < cols; ++k) {
          float amax = 0;
          for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(n[static_cast<std::size_t>(k * 16 + j)]));
          // FlashInfer's order: g x (amax x 1/6), with 1/6 rounded to fp32 first ((g x amax) / 6 differs by one e4m3
          // step on ties, in a few blocks of these very cases).
          const std::uint8_t sf = fp8(scale * (amax * (1.0f / 6.0f)));
          const std::size_t at = layout == fiar::ScaleLayout::Linear ? static_cast<std::size_t>(t) * cols + k
                                                                     : swizzled_offset(t, k, cols);
          mismatches += o.block_scales[at] != sf;
          const float factor = fp8_value(sf) == 0.0f ? 0.0f : scale / fp8_value(sf);
          for (int j = 0; j < 16; ++j) {
            const std::uint8_t byte = o.quant[static_cast<std::size_t>(t) * (s.hidden / 2) + (k * 16 + j) / 2];
            const std::uint8_t nibble = j % 2 == 0 ? (byte & 0xf) : (byte >> 4);
            mismatches += nibble != fp4(n[static_cast<std::size_t>(k * 16 + j)] * factor);
          }
        }
      }
    }
    CHECK(mismatches == 0);
    CHECK(far_pre == 0);
    CHECK(far_group == 0);
    if constexpr (P == fiar::Pattern::ResidualRmsNormFp8Group) {
      // Byte for byte, padding included: the rows past num_tokens and the last pack's bytes past the last group zero.
      if (!o.norm_out.empty()) CHECK(o.block_scales == group_scales);
      std::size_t padding = 0, nonzero = 0;
      const int cols = fiar::algo::fp8_group_scale_cols(s.hidden, group, quant.group_scale);
      for (int c = 0; c + 1 < cols; ++c) {
        for (int t = s.tokens; t < (s.tokens + 3) / 4 * 4; ++t, ++padding) {
          for (int b = 0; b < 4; ++b) nonzero += o.block_scales[4 * (c * ((s.tokens + 3) / 4 * 4) + t) + b] != 0;
        }
      }
      if (quant.group_scale == fiar::GroupScale::Ue8m0Packed) {
        for (int t = 0; t < s.tokens; ++t) {
          for (int k = groups; k < cols * 4; ++k, ++padding)
            nonzero += o.block_scales[group_scale_at(t, k, s.tokens, quant.group_scale)] != 0;
        }
      }
      CAPTURE(padding);
      CHECK(nonzero == 0);
    }
    if constexpr (P == fiar::Pattern::ResidualRmsNormNvfp4 || P == fiar::Pattern::ResidualRmsNormMxfp8) {
      if (layout == fiar::ScaleLayout::Swizzled128x4) {  // padding rows and columns are zero
        const int cols = s.hidden / (P == fiar::Pattern::ResidualRmsNormNvfp4 ? 16 : 32),
                  padded_cols = (cols + 3) / 4 * 4, padded_rows = (s.tokens + 127) / 128 * 128;
        int nonzero = 0;
        for (int m = 0; m < padded_rows; ++m) {
          for (int k = 0; k < padded_cols; ++k) {
            if ((m >= s.tokens || k >= cols) && o.block_scales[swizzled_offset(m, k, cols)] != 0) ++nonzero;
          }
        }
        CHECK(nonzero == 0);
      }
    }
  }
}

}  // namespace fiar_test
