// SPDX-License-Identifier: Apache-2.0
// fiar/algo/convert.hpp — element <-> fp32 conversions and Vec16 packing, for host and device alike.
// Contract: to_float/from_float are the CUDA conversion functions (round to nearest even), which have identical host
// and device definitions, so the host emulator produces the bits a GPU produces.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/prelude.hpp"
#include "../exec/vec.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

using exec::Vec16;

/// x as fp32 (exact).
/// a * b + c rounded once (fused multiply-add) on both machines: nvcc would contract `c += a * b` into an FFMA on
/// the GPU while g++ rounds twice on x86-64, so the norm's sum of squares says which one it means.
FIAR_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// a + b rounded to nearest, subnormals kept, on both machines whatever the compiler's flags: under -ftz=true (part of
/// --use_fast_math) nvcc emits add.ftz.f32 for `a + b` and __fadd_rn, which flushes a subnormal sum to a zero of its
/// sign, so a sum could become -0 (and collide with the Lamport sentinel); add.rn.f32 written out never flushes.
FIAR_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a + b;
#endif
}

template <ReduceType T>
FIAR_HD inline float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

/// x rounded to T (to nearest even; a no-op for float).
template <ReduceType T>
FIAR_HD inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

/// Elements of T in one Vec16.
template <ReduceType T>
inline constexpr int kElemsPerVec = 16 / static_cast<int>(sizeof(T));

namespace detail {
/// Vec16s per token of hidden_dim elements of T (hidden_dim a multiple of kElemsPerVec<T>, as creation checks).
template <ReduceType T>
constexpr int vecs_per_token(int hidden_dim) {
  return hidden_dim / kElemsPerVec<T>;
}
}  // namespace detail

/// The elements of a Vec16, converted to fp32.
template <ReduceType T>
struct FloatPack {
  float v[kElemsPerVec<T>];
};

/// acc.v[i] += element i of `in`.
template <ReduceType T>
FIAR_HD inline void unpack_add(const Vec16& in, FloatPack<T>& acc) {
  T e[kElemsPerVec<T>];
  memcpy(static_cast<void*>(e), &in, sizeof(in));
  FIAR_UNROLL
  for (int i = 0; i < kElemsPerVec<T>; ++i) acc.v[i] = add_rn(acc.v[i], to_float(e[i]));
}

/// The elements of f rounded to T, as one Vec16.
template <ReduceType T>
FIAR_HD inline Vec16 pack(const FloatPack<T>& f) {
  T e[kElemsPerVec<T>];
  FIAR_UNROLL
  for (int i = 0; i < kElemsPerVec<T>; ++i) e[i] = from_float<T>(f.v[i]);
  Vec16 out;
  memcpy(&out, e, sizeof(out));
  return out;
}

}  // namespace algo
FIAR_END_NAMESPACE
