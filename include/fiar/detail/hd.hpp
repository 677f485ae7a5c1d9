// fiar/detail/hd.hpp — what algo/ code needs to compile for both the host and the device.
// Contract: FIAR_HD marks functions that run on both; Vec16 is the 16-byte unit every protocol moves;
// the helpers here are pure functions of their arguments, identical in both worlds.
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>

#include "../version.hpp"

#if defined(__CUDA_ARCH__)
#define FIAR_UNROLL _Pragma("unroll")
#else
#define FIAR_UNROLL
#endif

#if defined(__CUDACC__)
#define FIAR_HD __host__ __device__
// Before a host-device template that is also instantiated with host-only types (HostCtx): nvcc then
// checks the execution space of each instantiation only where it is used.
#define FIAR_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define FIAR_EXEC_CHECK_DISABLE
#define FIAR_HD
#endif

namespace fiar::inline v0_1::detail {

/// The 16-byte vector every protocol moves: four 32-bit words, 16-byte aligned.
using Vec16 = uint4;

/// 32-bit words per Vec16.
inline constexpr int kWordsPerVec = 4;

/// The Lamport "not yet written" word: fp32 negative zero. Payload words never equal it (sanitize()).
inline constexpr std::uint32_t kSentinelWord = 0x80000000u;

FIAR_HD constexpr Vec16 sentinel_vec() { return Vec16{kSentinelWord, kSentinelWord, kSentinelWord, kSentinelWord}; }

/// True when any word of v still holds the sentinel (bit compare: float compares break under FTZ).
FIAR_HD constexpr bool has_sentinel(const Vec16& v) {
  return v.x == kSentinelWord || v.y == kSentinelWord || v.z == kSentinelWord || v.w == kSentinelWord;
}

/// Replaces every negative zero element of the word by +0, so that no payload word equals the sentinel.
/// For 16-bit elements both halves are checked; for 32-bit elements the whole word.
template <int ElementBytes>
FIAR_HD constexpr std::uint32_t sanitize_word(std::uint32_t w) {
  if constexpr (ElementBytes == 4) {
    return w == 0x80000000u ? 0u : w;
  } else {
    static_assert(ElementBytes == 2, "fiar reduces 2- and 4-byte elements only");
    if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
    if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
    return w;
  }
}

template <int ElementBytes>
FIAR_HD constexpr Vec16 sanitize(Vec16 v) {
  return Vec16{sanitize_word<ElementBytes>(v.x), sanitize_word<ElementBytes>(v.y), sanitize_word<ElementBytes>(v.z),
               sanitize_word<ElementBytes>(v.w)};
}

}  // namespace fiar::inline v0_1::detail
