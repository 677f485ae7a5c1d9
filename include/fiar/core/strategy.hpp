// SPDX-License-Identifier: Apache-2.0
// fiar/core/strategy.hpp — how a Lamport call reduces (one-shot or two-shot) and the built-in table that picks one.
// Contract: constexpr and identical on every rank (only values every rank shares go in); a Strategy value outside
// the enumeration is rejected with std::invalid_argument naming it, never run as some default.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "backend.hpp"
#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// One-shot (every rank reduces everything) or two-shot (reduce-scatter, then all-gather); Auto: the table.
/// Multimem (mnnvl only): the NVSwitch reduces, each rank load-reduces its share through the multicast mapping
/// (multimem.ld_reduce) and stores the sum back through it (multimem.st).
enum class Strategy { Auto, OneShot, TwoShot, Multimem };

namespace detail {
inline constexpr std::string_view kStrategyNames[] = {"auto", "oneshot", "twoshot", "multimem"};
}

/// Whether s is one of the enumerators (a value cast from an integer may not be).
constexpr bool is_valid(Strategy s) noexcept {
  return static_cast<int>(s) >= 0 && static_cast<int>(s) < static_cast<int>(std::size(detail::kStrategyNames));
}

/// "auto", "oneshot", "twoshot", "multimem" ("invalid" outside the enumeration).
constexpr std::string_view to_string(Strategy s) noexcept {
  return is_valid(s) ? detail::kStrategyNames[static_cast<int>(s)] : std::string_view("invalid");
}

namespace detail {
/// "Strategy value 7 is not a strategy; allowed: ...", without the "fiar: " that begins every message.
inline std::string strategy_value_text(Strategy s) {
  return "Strategy value " + std::to_string(static_cast<int>(s)) +
         " is not a strategy; allowed: auto, oneshot, twoshot, multimem. Fix: pass fiar::Strategy::Auto, OneShot, "
         "TwoShot or Multimem.";
}
}  // namespace detail

/// Throws std::invalid_argument naming the value unless s is an enumerator.
inline void check_strategy(Strategy s) {
  if (!is_valid(s)) throw std::invalid_argument("fiar: " + detail::strategy_value_text(s));
}

/// The built-in strategy table of the trtllm backend: per-rank message bytes (tokens x hidden x sizeof(T)) up to
/// which one-shot is faster, by architecture and world size. Anchored on the per-GPU tables inference engines
/// measured for this protocol pair (H100 / B200); replace it with WorkspaceConfig::oneshot_max_bytes after
/// measuring with the benchmark.
constexpr std::size_t default_oneshot_max_bytes(int arch, int world_size) {
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  const bool blackwell = arch >= 100;
  if (world_size <= 2) return 32 * MiB;
  if (world_size <= 4) return blackwell ? 4 * MiB : 2 * MiB;
  if (world_size <= 8) return blackwell ? 1 * MiB : 512 * KiB;
  return blackwell ? 512 * KiB : 256 * KiB;
}

/// The built-in table of a backend. mnnvl: one-shot while the bytes every rank receives (W x the message) stay
/// within 1 MiB, the threshold FlashInfer measured for multicast one-shot; trtllm: the table above.
constexpr std::size_t default_oneshot_max_bytes(Backend backend, int arch, int world_size) {
  if (backend == Backend::Mnnvl)
    return (std::size_t{1} << 20) / static_cast<std::size_t>(world_size < 1 ? 1 : world_size);
  return default_oneshot_max_bytes(arch, world_size);
}

/// Strategy::Auto resolved: one-shot for a single rank, for fewer tokens than ranks (two-shot would leave owners
/// idle) and up to the threshold; two-shot beyond. Depends only on values every rank shares.
constexpr Strategy choose_strategy(int world_size, int num_tokens, std::size_t message_bytes,
                                   std::size_t oneshot_max_bytes) {
  if (world_size == 1 || num_tokens < world_size || message_bytes <= oneshot_max_bytes) return Strategy::OneShot;
  return Strategy::TwoShot;
}

FIAR_END_NAMESPACE
