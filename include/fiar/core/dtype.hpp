// SPDX-License-Identifier: Apache-2.0
// fiar/core/dtype.hpp — the element types an all-reduce workspace is instantiated for, and their one encoding.
// Contract: ReduceType<T> holds for exactly float, __half and __nv_bfloat16 (cv-unqualified); every reduction
// accumulates in fp32 whatever T is; dtype_code / dtype_name(code) are the one wire encoding of an element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <concepts>
#include <cstdint>
#include <string_view>

#include "prelude.hpp"

/// Calls X(args..., T) for every element type fiar reduces (explicit instantiations are spelled with it).
#define FIAR_FOR_EACH_DTYPE(X, ...) X(__VA_ARGS__, float) X(__VA_ARGS__, __half) X(__VA_ARGS__, __nv_bfloat16)

FIAR_BEGIN_NAMESPACE

/// The element types fiar reduces: float, __half, __nv_bfloat16.
template <class T>
concept ReduceType = std::same_as<T, float> || std::same_as<T, __half> || std::same_as<T, __nv_bfloat16>;

/// The code of a reduce type in records that ranks exchange: 1 float, 2 half, 3 bf16 (0: none).
template <ReduceType T>
constexpr std::uint32_t dtype_code() noexcept {
  if constexpr (std::same_as<T, float>) {
    return 1;
  } else if constexpr (std::same_as<T, __half>) {
    return 2;
  } else {
    return 3;
  }
}

/// Name of a reduce type code as fiar prints it ("float", "half", "bf16"; "invalid" for anything else).
constexpr std::string_view dtype_name(std::uint32_t code) noexcept {
  switch (code) {
    case 1: return "float";
    case 2: return "half";
    case 3: return "bf16";
  }
  return "invalid";
}

/// Name of a reduce type as fiar prints it ("float", "half", "bf16").
template <ReduceType T>
constexpr std::string_view dtype_name() noexcept {
  return dtype_name(dtype_code<T>());
}

FIAR_END_NAMESPACE
