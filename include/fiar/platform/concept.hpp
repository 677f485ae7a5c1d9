// SPDX-License-Identifier: Apache-2.0
// fiar/platform/concept.hpp — what a platform must provide for a workspace to run on it.
// Contract: Platform<P> holds for HostPlatform and CudaPlatform (and any type with the same members); naming
// Workspace<Policy, T, X> with anything else is a compile error whose diagnostic names this concept.
#pragma once

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../comm/bootstrap.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "../exec/host.hpp"
#include "region.hpp"

FIAR_BEGIN_NAMESPACE

namespace detail {
// An operation that does nothing: what the concept launches in an unevaluated context.
struct NoOperation {
  struct Params {};
  static constexpr const char* name = "no operation";
  static constexpr int max_threads = 32;
  static constexpr int min_blocks_per_sm = 0;
  static constexpr exec::LaunchShape shape(const Params&, const exec::LaunchLimits&) { return {1, 32}; }
  template <class Ctx>
  FIAR_HD static void run(Ctx&, const Params&) {}
};
/// Waits for what is queued on `stream` where the platform queues launches on the host (the emulator's asynchronous
/// mode), before host code reads what they wrote (the emulator's library sum); nothing on other platforms.
template <class Pf>
void wait_if_queued(Pf& platform, cudaStream_t stream) {
  if constexpr (requires {
                  platform.asynchronous();
                  platform.synchronize(stream);
                }) {
    if (platform.asynchronous()) platform.synchronize(stream);
  }
}
}  // namespace detail

/// Where a workspace's memory lives and how its operations run: options, collective allocation of rank-visible
/// (and multicast) memory over a bootstrap, local and host-visible memory, pointer checks, launches of operations.
template <class P>
concept Platform = std::move_constructible<P> &&
                   requires {
                     typename P::Options;
                     { P::name } -> std::convertible_to<const char*>;
                     { P::synchronous } -> std::convertible_to<bool>;
                   } &&
                   requires(P& p, const P& cp, InProcessBootstrap& boot, std::size_t n, std::uint32_t* words,
                            const void* ptr, const typename detail::NoOperation::Params& params, cudaStream_t stream) {
                     P(typename P::Options{});
                     { p.allocate_shared(boot, n) } -> std::same_as<std::vector<std::uint32_t*>>;
                     { p.allocate_multicast(boot, n) } -> std::same_as<MulticastRegion>;
                     { p.allocate_local(n) } -> std::same_as<void*>;
                     { p.allocate_local(n, "what") } -> std::same_as<void*>;
                     { p.allocate_host_visible(n) } -> std::same_as<void*>;
                     p.fill_words(words, n, std::uint32_t{0});
                     { P::read_word(words) } -> std::same_as<std::uint32_t>;
                     cp.check_pointer(ptr, "name");
                     p.template launch<detail::NoOperation>(params, stream);
                     { cp.arch() } -> std::convertible_to<int>;
                     p.synchronize();
                   };

FIAR_END_NAMESPACE
