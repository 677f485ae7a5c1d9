// SPDX-License-Identifier: Apache-2.0
// fiar/exec/vec.hpp — the 16-byte unit every protocol moves, and the Lamport sentinel.
// Contract: Vec16 is four 32-bit words, 16-byte aligned; the helpers are pure functions of their arguments,
// identical on the host and the device.
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

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

/// Replaces every negative zero element of the word by +0, so that no payload word equals the sentinel. For
/// 16-bit elements both halves are checked; for 32-bit elements the whole word.
template <int ElementBytes>
FIAR_HD constexpr std::uint32_t sanitize_word(std::uint32_t w) {
  if constexpr (ElementBytes == 4) {
    return w == 0x80000000u ? 0u : w;
  } else {
    static_assert(ElementBytes == 2, "fiar reduces 2- and 4-byte elements only");
    // Per 16-bit half h: bit 15 of (h & 0x7fff) + 0x7fff is set iff h's low 15 bits are not all zero (no carry leaves
    // the half), so h & (that | 0x7fff) clears bit 15 exactly when h is 0x8000, -0. Three instructions per word
    // (LOP3, IADD3, LOP3) instead of two compares and selects per half.
    return w & (((w & 0x7fff7fffu) + 0x7fff7fffu) | 0x7fff7fffu);
  }
}

template <int ElementBytes>
FIAR_HD constexpr Vec16 sanitize(Vec16 v) {
  return Vec16{sanitize_word<ElementBytes>(v.x), sanitize_word<ElementBytes>(v.y), sanitize_word<ElementBytes>(v.z),
               sanitize_word<ElementBytes>(v.w)};
}

}  // namespace exec
FIAR_END_NAMESPACE
