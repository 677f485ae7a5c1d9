// SPDX-License-Identifier: Apache-2.0
// fiar/algo/quant.hpp — the quantized formats the fused epilogues write: FP8 e4m3 (per tensor, per token, per group
// of a token with power-of-two scales) and NVFP4 (e2m1 values, e4m3 block scales), with their scale layouts.
// Contract: conversions are the CUDA ones (cuda_fp8.h / cuda_fp4.h: round to nearest even, saturating to
// the largest finite value), identical on host and device; layouts are pure functions of their indices.
#pragma once

// cuda_fp4.hpp (CUDA 13.0) has unused parameters; keep -Wextra users' builds quiet.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../core/pattern.hpp"
#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

/// Largest finite e4m3 value, and e2m1's.
inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;
/// 1 / 6 rounded to fp32, the factor FlashInfer's NVFP4 block scale multiplies by (instead of dividing by 6).
inline constexpr float kInvFp4Max = 1.0f / 6.0f;
/// Elements per NVFP4 block (one e4m3 scale each), and per MXFP8 block (one e8m0 scale each).
inline constexpr int kNvfp4Block = 16;
inline constexpr int kMxfp8Block = 32;
/// Most 16-byte vectors in one FP8 group (FusedArgs::group_size): a warp's lanes, since on the GPU a group's maximum
/// is one warp's butterfly (ExecutionContext::group_max).
inline constexpr int kMaxGroupVecs = 32;

/// float -> e4m3, round to nearest even, saturating (NaN stays NaN).
FIAR_HD inline std::uint8_t to_fp8_e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

/// e4m3 -> float (exact).
FIAR_HD inline float from_fp8_e4m3(std::uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
  return __half2float(__half(h));
}

/// float -> e2m1 (low nibble), round to nearest even, saturating.
FIAR_HD inline std::uint8_t to_fp4_e2m1(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xf);
}

/// Two floats -> two e2m1 values in one byte, `lo` in the low nibble (one cvt...e2m1x2 on sm_100); the same values as
/// two to_fp4_e2m1 calls.
FIAR_HD inline std::uint8_t to_fp4_e2m1x2(float lo, float hi) {
  return static_cast<std::uint8_t>(__nv_cvt_float2_to_fp4x2(make_float2(lo, hi), __NV_E2M1, cudaRoundNearest) & 0xff);
}

/// e2m1 (low nibble) -> float (exact).
FIAR_HD inline float from_fp4_e2m1(std::uint8_t q) {
  const __half_raw h = __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(q & 0xf), __NV_E2M1);
  return __half2float(__half(h));
}

/// Dynamic per-token FP8 scale: amax / 448, at least 1 / (512 x 448) so that an all-zero row stays finite.
FIAR_HD constexpr float fp8_dynamic_scale(float amax) {
  const float s = amax / kFp8Max;
  const float floor = 1.0f / (512.0f * kFp8Max);
  return s > floor ? s : floor;
}

FIAR_HD constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }

/// Bytes of a block-scale tensor of num_tokens rows and `cols` one-byte scales per row (NVFP4, MXFP8).
FIAR_HD constexpr std::size_t block_scale_bytes(int num_tokens, int cols, ScaleLayout layout) {
  return layout == ScaleLayout::Linear
             ? static_cast<std::size_t>(num_tokens) * static_cast<std::size_t>(cols)
             : static_cast<std::size_t>(round_up(num_tokens, 128)) * static_cast<std::size_t>(round_up(cols, 4));
}

/// Byte offset of the scale of (row m, block column k) of a block-scale tensor of `cols` columns. Swizzled 128x4:
/// 128-row x 4-column tiles of 512 bytes, tiles row-major over the padded columns; inside a tile, row m % 32 picks a
/// 16-byte line, the 32-row quarter (m % 128) / 32 a 4-byte group within it, and k % 4 the byte.
FIAR_HD constexpr std::size_t block_scale_offset(int m, int k, int cols, ScaleLayout layout) {
  if (layout == ScaleLayout::Linear) return static_cast<std::size_t>(m) * static_cast<std::size_t>(cols) + k;
  const std::size_t k_tiles = static_cast<std::size_t>(round_up(cols, 4) / 4);
  return static_cast<std::size_t>(m / 128) * k_tiles * 512 + static_cast<std::size_t>(k / 4) * 512 +
         static_cast<std::size_t>(m % 32) * 16 + static_cast<std::size_t>((m % 128) / 32) * 4 +
         static_cast<std::size_t>(k % 4);
}

/// NVFP4: columns of the scale matrix (one per 16-element block), the tensor's bytes for num_tokens rows, and the
/// offset of (row m, block k).
FIAR_HD constexpr int nvfp4_scale_cols(int hidden_dim) { return hidden_dim / kNvfp4Block; }
FIAR_HD constexpr std::size_t nvfp4_scale_bytes(int num_tokens, int hidden_dim, ScaleLayout layout) {
  return block_scale_bytes(num_tokens, nvfp4_scale_cols(hidden_dim), layout);
}
FIAR_HD constexpr std::size_t nvfp4_scale_offset(int m, int k, int hidden_dim, ScaleLayout layout) {
  return block_scale_offset(m, k, nvfp4_scale_cols(hidden_dim), layout);
}

/// MXFP8: the same, one e8m0 scale per 32-element block.
FIAR_HD constexpr int mxfp8_scale_cols(int hidden_dim) { return hidden_dim / kMxfp8Block; }
FIAR_HD constexpr std::size_t mxfp8_scale_bytes(int num_tokens, int hidden_dim, ScaleLayout layout) {
  return block_scale_bytes(num_tokens, mxfp8_scale_cols(hidden_dim), layout);
}
FIAR_HD constexpr std::size_t mxfp8_scale_offset(int m, int k, int hidden_dim, ScaleLayout layout) {
  return block_scale_offset(m, k, mxfp8_scale_cols(hidden_dim), layout);
}

/// amax / 448 in fp32 without the division routine: the fp64 product with 1 / 448, which is the IEEE quotient whenever
/// that is a normal float (448 = 7 x 2^6: such a quotient, if not exact, lies at least 2^-27 of itself from every fp32
/// rounding midpoint, the product within 2^-51; test_quant checks a sweep). A subnormal quotient (below 2^-126) may
/// differ in its last place; both scales that use it are floored far above that (1e-10; e8m0's 2^-127 byte 0).
FIAR_HD inline float over_fp8_max(float amax) { return static_cast<float>(static_cast<double>(amax) * (1.0 / 448.0)); }

/// The per-token-group FP8 scale of a group whose largest magnitude is amax: y = max(amax / 448, 1e-10), then rounded
/// up to a power of two (a non-zero mantissa carries into the exponent), so that n / y is exact and the scale is one
/// exponent byte (UE8M0). FlashInfer's and DeepGEMM's scale (amax / 448: over_fp8_max).
FIAR_HD inline float fp8_group_scale(float amax) {
  const float y = over_fp8_max(amax);
  const float floor = 1e-10f;
  const float clamped = y > floor ? y : floor;
  std::uint32_t bits;
  memcpy(&bits, &clamped, sizeof(bits));
  if ((bits & 0x7fffffu) != 0) bits = (bits + 0x800000u) & 0x7f800000u;
  float out;
  memcpy(&out, &bits, sizeof(out));
  return out;
}

/// 1 / y for a power of two y (exact: the reciprocal is a power of two too; 2^-127 is subnormal, 0 for an infinite y),
/// from the exponent bits, so that n x (1 / y) is the IEEE quotient n / y on both machines without a division.
FIAR_HD inline float pow2_reciprocal(float y) {
  std::uint32_t bits;
  memcpy(&bits, &y, sizeof(bits));
  const std::uint32_t e = (bits >> 23) & 0xffu;
  const std::uint32_t r = e >= 255u ? 0u : e == 254u ? 0x00400000u : (254u - e) << 23;
  float out;
  memcpy(&out, &r, sizeof(out));
  return out;
}

/// The MXFP8 block scale of a block whose largest magnitude is amax: amax / 448 to e8m0 rounded toward +inf,
/// saturating (CUDA's __nv_cvt_float_to_e8m0; one cvt.rp.satfinite.ue8m0x2 on sm_100), the byte 2^(byte - 127).
FIAR_HD inline std::uint8_t mxfp8_scale(float amax) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_e8m0(over_fp8_max(amax), __NV_SATFINITE, cudaRoundPosInf));
}

/// 2^(127 - byte): the factor an MXFP8 block's values are multiplied by (2^-127 for byte 254; 0 for 255, NaN).
FIAR_HD inline float e8m0_reciprocal(std::uint8_t byte) {
  const std::uint32_t r = byte == 255u ? 0u : byte == 254u ? 0x00400000u : (254u - byte) << 23;
  float out;
  memcpy(&out, &r, sizeof(out));
  return out;
}

/// The exponent byte of a power-of-two fp32 scale (its biased exponent), as GroupScale::Ue8m0Packed stores it.
FIAR_HD inline std::uint8_t ue8m0_of(float power_of_two) {
  std::uint32_t bits;
  memcpy(&bits, &power_of_two, sizeof(bits));
  return static_cast<std::uint8_t>(bits >> 23);
}

/// Rows of each column of the group-scale tensor: num_tokens rounded up to 4 (the column stride, in 4-byte elements).
FIAR_HD constexpr int fp8_group_scale_rows(int num_tokens) { return round_up(num_tokens, 4); }

/// Its 4-byte columns: one per group (Float32), or one per 4 groups (Ue8m0Packed); 0 for a group_size below 1.
FIAR_HD constexpr int fp8_group_scale_cols(int hidden_dim, int group_size, GroupScale format) {
  const int groups = group_size > 0 ? hidden_dim / group_size : 0;
  return format == GroupScale::Ue8m0Packed ? (groups + 3) / 4 : groups;
}

/// Bytes of the group-scale tensor for num_tokens rows: a [num_tokens, cols] tensor of 4-byte elements with strides
/// (1, fp8_group_scale_rows(num_tokens)), 4 x (num_tokens + (cols - 1) x rows) bytes (torch.empty_strided's
/// storage: the last column ends at row num_tokens).
FIAR_HD constexpr std::size_t fp8_group_scale_bytes(int num_tokens, int hidden_dim, int group_size, GroupScale format) {
  const int cols = fp8_group_scale_cols(hidden_dim, group_size, format);
  if (cols < 1 || num_tokens < 1) return 0;
  return 4 * (static_cast<std::size_t>(num_tokens) +
              static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(fp8_group_scale_rows(num_tokens)));
}

/// Byte offset of the scale of (token t, group g): Float32 at element g x rows + t; Ue8m0Packed byte g % 4 of the
/// int32 element (g / 4) x rows + t (little-endian: byte j holds group 4p + j).
FIAR_HD constexpr std::size_t fp8_group_scale_offset(int t, int g, int num_tokens, GroupScale format) {
  const auto rows = static_cast<std::size_t>(fp8_group_scale_rows(num_tokens));
  if (format == GroupScale::Float32) return 4 * (static_cast<std::size_t>(g) * rows + static_cast<std::size_t>(t));
  return 4 * (static_cast<std::size_t>(g / 4) * rows + static_cast<std::size_t>(t)) + static_cast<std::size_t>(g % 4);
}

}  // namespace algo
FIAR_END_NAMESPACE
