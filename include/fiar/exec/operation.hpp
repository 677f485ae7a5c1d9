// SPDX-License-Identifier: Apache-2.0
// fiar/exec/operation.hpp — the one shape every kernel has: an operation type with its parameters, its launch
// shape and run(ctx, params) over any execution context.
// Contract: a platform launches an Operation without knowing what it computes (HostPlatform on the emulated grid,
// CudaPlatform through the one __global__ template of exec/kernel.cuh); Params are trivially copyable (they travel
// as a __grid_constant__ kernel parameter); every lane of every block calls run().
#pragma once

#include <concepts>
#include <type_traits>

#include "../core/prelude.hpp"
#include "context.hpp"
#include "context_model.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// A kernel, as a type:
///   struct MyOp {
///     struct Params { ... };                       // trivially copyable
///     static constexpr const char* name = "...";   // in launch errors
///     static constexpr int max_threads = 1024;     // __launch_bounds__ of its kernel
///     static constexpr int min_blocks_per_sm = 0;  // 0: let ptxas choose
///     static LaunchShape shape(const Params&, const LaunchLimits&);
///     template <ExecutionContext Ctx> FIAR_HD static void run(Ctx&, const Params&);
///     static constexpr int min_arch = 100;         // optional: lowest compute capability x 10 it runs on; the
///   };                                             // kernel built for an older one is a stub that traps
template <class Op>
concept Operation =
    requires {
      typename Op::Params;
      { Op::name } -> std::convertible_to<const char*>;
      { Op::max_threads } -> std::convertible_to<int>;
      { Op::min_blocks_per_sm } -> std::convertible_to<int>;
    } && std::is_trivially_copyable_v<typename Op::Params> &&
    requires(const typename Op::Params& p, const LaunchLimits& limits, ::fiar::detail::ContextModel& ctx) {
      { Op::shape(p, limits) } -> std::same_as<LaunchShape>;
      Op::run(ctx, p);
    };

/// Op::min_arch, or 0 when the operation runs everywhere (a variable: device code reads it without a host call).
template <class Op>
inline constexpr int min_arch_of = 0;
template <class Op>
  requires requires { Op::min_arch; }
inline constexpr int min_arch_of<Op> = Op::min_arch;

/// What the per-token operations share (fiar's Lamport kernels and the epilogue pass): Params with num_tokens (or
/// epi.num_tokens) and
/// vecs_per_token, kMaxSpreadThreads threads at most and one resident block per SM promised to ptxas (the grid never
/// places two of a call's blocks on one SM; without the promise ptxas aims at two and spills at 32 registers),
/// spread_shape as their grid (a token's vectors over a cluster of blocks), on element type T for epilogue P (a
/// Pattern or a user epilogue's tag, named in launch errors).
template <class ParamsT, auto P, class T>
struct PerTokenOperation {
  using Params = ParamsT;
  using value_type = T;
  static constexpr auto pattern = P;
  static constexpr int max_threads = kMaxSpreadThreads;
  static constexpr int min_blocks_per_sm = 1;
  static constexpr LaunchShape shape(const Params& p, const LaunchLimits& limits) {
    if constexpr (requires { p.num_tokens; }) {
      return spread_shape(p.num_tokens, p.vecs_per_token, limits.max_blocks);
    } else {  // the call's own arguments carry it (algo::LamportParams::epi)
      return spread_shape(p.epi.num_tokens, p.vecs_per_token, limits.max_blocks);
    }
  }
};

}  // namespace exec
FIAR_END_NAMESPACE
