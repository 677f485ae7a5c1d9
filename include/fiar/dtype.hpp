// fiar/dtype.hpp — the element types an all-reduce workspace is instantiated for.
// Contract: ReduceType<T> holds for exactly float, __half and __nv_bfloat16 (cv-unqualified);
// every reduction accumulates in fp32 whatever T is.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <concepts>
#include <string_view>

#include "version.hpp"

namespace fiar::inline v0_1 {

/// The element types fiar reduces: float, __half, __nv_bfloat16.
template <class T>
concept ReduceType = std::same_as<T, float> || std::same_as<T, __half> || std::same_as<T, __nv_bfloat16>;

/// Name of a reduce type as fiar prints it ("float", "half", "bf16").
template <ReduceType T>
constexpr std::string_view dtype_name() noexcept {
  if constexpr (std::same_as<T, float>) {
    return "float";
  } else if constexpr (std::same_as<T, __half>) {
    return "half";
  } else {
    return "bf16";
  }
}

}  // namespace fiar::inline v0_1
