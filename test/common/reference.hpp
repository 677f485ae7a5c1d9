// SPDX-License-Identifier: Apache-2.0
// Independent references for the all-reduce tests: plain loops over plain arrays, no fiar code paths.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace fiar_test {

template <class T>
float as_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

template <class T>
std::uint32_t bits(T x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <class T>
T from_bits(std::uint32_t b) {
  T x;
  std::memcpy(static_cast<void*>(&x), &b, sizeof(T));
  return x;
}

template <class T>
bool is_negative_zero(T x) {
  return bits(x) == (sizeof(T) == 4 ? 0x80000000u : 0x8000u);
}

/// fiar's documented result: the fp32 sum in rank order (starting from +0), rounded to T, with -0
/// reported as +0. Computed here element by element with the CUDA conversion functions.
template <class T>
std::vector<T> rank_order_sum(const std::vector<std::vector<T>>& inputs, std::size_t count) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (const auto& in : inputs) {
      const float x = as_float(in[i]);
      acc += (x == 0.0f ? 0.0f : x);  // fiar sends -0 as +0
    }
    T r = from_float<T>(acc);
    if (is_negative_zero(r)) r = from_float<T>(0.0f);
    out[i] = r;
  }
  return out;
}

/// The exact sum in fp64 (what an all-reduce approximates).
template <class T>
std::vector<double> exact_sum(const std::vector<std::vector<T>>& inputs, std::size_t count) {
  std::vector<double> out(count, 0.0);
  for (const auto& in : inputs) {
    for (std::size_t i = 0; i < count; ++i) out[i] += static_cast<double>(as_float(in[i]));
  }
  return out;
}

/// Unit roundoff of T (half an ulp at 1.0): 2^-24 float, 2^-11 half, 2^-8 bf16.
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, float>) {
    return std::ldexp(1.0, -24);
  } else if constexpr (std::is_same_v<T, __half>) {
    return std::ldexp(1.0, -11);
  } else {
    return std::ldexp(1.0, -8);
  }
}

/// The documented bound (docs/design.md, "Numerics"): |out - exact| <= u_T |exact| + (W - 1) 2^-24 sum|x_r|
/// + the smallest subnormal of T (rounding near zero), where u_T is T's unit roundoff.
template <class T>
double error_bound(double exact, double abs_sum, int world) {
  const double tiny = std::is_same_v<T, float>    ? std::ldexp(1.0, -149)
                      : std::is_same_v<T, __half> ? std::ldexp(1.0, -24)
                                                  : std::ldexp(1.0, -133);
  return unit_roundoff<T>() * std::fabs(exact) * (1 + 1e-6) +
         (world - 1) * std::ldexp(1.0, -24) * abs_sum * (1 + 1e-6) + tiny;
}

/// Inputs for rank `rank`, call `call`: mostly values of both signs over several magnitudes, with
/// -0.0, +0.0, subnormals of T and (for 16-bit T) element pairs whose 32-bit word equals fp32 -0.
template <class T>
std::vector<T> make_input(std::size_t count, int rank, int call, bool specials = true) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + call * 104729 + 17));
  std::uniform_real_distribution<float> mag(-8.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    const int kind = specials ? pick(rng) : 15;
    float x = 0.0f;
    switch (kind) {
      case 0: x = -0.0f; break;
      case 1: x = 0.0f; break;
      case 2:  // a subnormal of T
        x = std::is_same_v<T, float>    ? std::ldexp(1.0f, -140) * (rank + 1)
            : std::is_same_v<T, __half> ? std::ldexp(1.0f, -20) * (rank + 1)
                                        : std::ldexp(1.0f, -130) * (rank + 1);
        if (rng() & 1) x = -x;
        break;
      default: x = mag(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 5) - 2); break;
    }
    v[i] = from_float<T>(x);
  }
  if (specials && sizeof(T) == 2) {
    // A (+0, -0) pair: the 32-bit word is 0x80000000, the Lamport sentinel. Also (-0, -0).
    for (std::size_t i = 0; i + 1 < count; i += 37) {
      v[i] = from_float<T>(0.0f);
      v[i + 1] = from_float<T>(-0.0f);
    }
    for (std::size_t i = 10; i + 1 < count; i += 53) {
      v[i] = from_float<T>(-0.0f);
      v[i + 1] = from_float<T>(-0.0f);
    }
  }
  return v;
}

template <class T>
std::string dtype_label() {
  return std::is_same_v<T, float> ? "float" : std::is_same_v<T, __half> ? "half" : "bf16";
}

}  // namespace fiar_test
