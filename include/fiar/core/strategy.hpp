// SPDX-License-Identifier: Apache-2.0
// fiar/core/strategy.hpp — how a call reduces (one-shot, two-shot, in the switch, or handed to NCCL) and the built-in
// table that picks one per message size.
// Contract: constexpr and identical on every rank (only values every rank shares go in: the backend, architecture,
// world size, interconnect and the message bytes); a Strategy value outside the enumeration is rejected with
// std::invalid_argument naming it, never run as some default.
#pragma once

#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "backend.hpp"
#include "prelude.hpp"
#include "topology.hpp"

FIAR_BEGIN_NAMESPACE

/// One-shot (every rank reduces everything) or two-shot (reduce-scatter, then all-gather); Auto: the table.
/// Multimem (mnnvl only): the NVSwitch reduces, each rank load-reduces its share through the multicast mapping
/// (multimem.ld_reduce) and stores the sum back through it (multimem.st).
/// Nccl (trtllm / mnnvl with their NCCL route; the nccl backend): the sum is ncclAllReduce's, inside the same
/// workspace, then fiar's fused epilogue.
enum class Strategy { Auto, OneShot, TwoShot, Multimem, Nccl };

namespace detail {
inline constexpr std::string_view kStrategyNames[] = {"auto", "oneshot", "twoshot", "multimem", "nccl"};
}

/// Whether s is one of the enumerators (a value cast from an integer may not be).
constexpr bool is_valid(Strategy s) noexcept {
  return static_cast<int>(s) >= 0 && static_cast<int>(s) < static_cast<int>(std::size(detail::kStrategyNames));
}

/// "auto", "oneshot", "twoshot", "multimem", "nccl" ("invalid" outside the enumeration).
constexpr std::string_view to_string(Strategy s) noexcept {
  return is_valid(s) ? detail::kStrategyNames[static_cast<int>(s)] : std::string_view("invalid");
}

namespace detail {
/// "Strategy value 7 is not a strategy; allowed: ...", without the "fiar: " that begins every message.
inline std::string strategy_value_text(Strategy s) {
  return "Strategy value " + std::to_string(static_cast<int>(s)) +
         " is not a strategy; allowed: auto, oneshot, twoshot, multimem, nccl. Fix: pass fiar::Strategy::Auto, "
         "OneShot, TwoShot, Multimem or Nccl.";
}
}  // namespace detail

/// Throws std::invalid_argument naming the value unless s is an enumerator.
inline void check_strategy(Strategy s) {
  if (!is_valid(s)) throw std::invalid_argument("fiar: " + detail::strategy_value_text(s));
}

/// The built-in strategy table of the trtllm backend: per-rank message bytes (tokens x hidden x sizeof(T)) up to
/// which one-shot is faster, by architecture and world size: the power of two nearest the size from which
/// scripts/model --table puts fiar's two-shot ahead (32 MiB at 2 ranks, where it never is: the largest size engines
/// measured one-shot ahead); a model figure, not measured; replace it with WorkspaceConfig::oneshot_max_bytes after
/// measuring with the benchmark.
constexpr std::size_t default_oneshot_max_bytes(int arch, int world_size) {
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  const bool blackwell = arch >= 100;
  if (world_size <= 2) return 32 * MiB;
  if (world_size <= 4) return 512 * KiB;
  if (world_size <= 8) return blackwell ? 256 * KiB : 128 * KiB;
  return blackwell ? 128 * KiB : 64 * KiB;
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

/// A threshold that is never reached: WorkspaceConfig{.nccl_min_bytes = fiar::never} turns a route off.
inline constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

/// Where Strategy::Auto changes path, in per-rank message bytes (tokens x hidden x sizeof(T)): one row of the
/// built-in table (default_strategy_thresholds) with the caller's WorkspaceConfig values over it. A workspace
/// resolves its row at creation and every rank agrees on it, so a call of the same size takes the same path on
/// every rank.
struct StrategyThresholds {
  std::size_t oneshot_max_bytes = 0;         ///< one-shot up to here (and whenever tokens < world size)
  std::size_t multimem_min_bytes = never;    ///< mnnvl: the in-switch reduction from here
  std::size_t nccl_min_bytes = never;        ///< trtllm / mnnvl: ncclAllReduce inside the workspace from here
  std::size_t nccl_symmetric_max_bytes = 0;  ///< NCCL on GPUs: through the symmetric window up to here, in place
                                             ///< on the caller's buffers beyond (the window's copies cost more)
  friend constexpr bool operator==(const StrategyThresholds&, const StrategyThresholds&) = default;
};

/// The built-in strategy table: the row for a group of `world_size` ranks of architecture `arch` (x10; 0: unknown,
/// taken as sm_90) over `interconnect` (Unknown: NVLink's row). Derived from scripts/model --table (NCCL's published
/// large-message figures against fiar's model, and the one-shot / two-shot crossover of that model;
/// docs/performance.md shows both); nothing in it has been measured by fiar-bench yet. The in-switch
/// reduction is off (never) until fiar-bench measures it on NVSwitch hardware, though the model puts it ahead of
/// two-shot from 512 KiB at 8 ranks: set WorkspaceConfig::multimem_min_bytes to take it.
constexpr StrategyThresholds default_strategy_thresholds(Backend backend, int arch, int world_size,
                                                         Interconnect interconnect) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  const bool blackwell = arch >= 100;
  StrategyThresholds t;
  t.oneshot_max_bytes = default_oneshot_max_bytes(backend, arch, world_size);
  t.nccl_symmetric_max_bytes = (blackwell ? 32 : 16) * MiB;
  if (backend == Backend::Nccl || world_size <= 1 || interconnect == Interconnect::Pcie) {
    // PCIe: NCCL's rings move what two-shot moves over the same links, so the model never hands a size over.
    return t;
  }
  if (blackwell) {
    if (world_size > 4) t.nccl_min_bytes = 128 * MiB;
  } else {
    t.nccl_min_bytes = world_size <= 4 ? 1024 * MiB : 64 * MiB;
  }
  return t;
}

/// Strategy::Auto resolved with a full row: NCCL from nccl_min_bytes when the workspace has its NCCL route, the
/// in-switch reduction from multimem_min_bytes when it has multicast, else one-shot / two-shot as above. A single
/// rank always takes one-shot (a copy).
constexpr Strategy choose_strategy(const StrategyThresholds& t, int world_size, int num_tokens,
                                   std::size_t message_bytes, bool multicast, bool nccl_route) {
  if (world_size > 1 && nccl_route && message_bytes >= t.nccl_min_bytes) return Strategy::Nccl;
  if (world_size > 1 && multicast && message_bytes >= t.multimem_min_bytes) return Strategy::Multimem;
  return choose_strategy(world_size, num_tokens, message_bytes, t.oneshot_max_bytes);
}

FIAR_END_NAMESPACE
