// SPDX-License-Identifier: Apache-2.0
// A call's success path allocates nothing: this file replaces the global operator new of the unit-test executable
// with one that counts, per thread, while a test asks it to; every rank of a warm workspace then makes calls of every
// engine (the Lamport strategies, the NCCL route, the nccl backend) and the count on its thread must stay 0. A
// rejected call, whose message is text, must count: the counter is seen to work.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/host_harness.hpp"

namespace {
thread_local bool g_counting = false;
thread_local long g_allocations = 0;

void* counted(std::size_t n, std::size_t align) {
  if (g_counting) ++g_allocations;
  const std::size_t size = n == 0 ? align : (n + align - 1) / align * align;
  if (void* p = align <= alignof(std::max_align_t) ? std::malloc(size) : std::aligned_alloc(align, size)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using fiar::Backend;
using fiar::Pattern;
using fiar::Strategy;
using T = __nv_bfloat16;

// Allocations on this thread while f runs.
template <class F>
long allocations_of(F&& f) {
  g_allocations = 0;
  g_counting = true;
  try {
    f();
  } catch (...) {
    g_counting = false;
    throw;
  }
  g_counting = false;
  return g_allocations;
}

// Two ranks of `backend` (through make_workspace, so AnyWorkspace's dispatch is on the path too), every strategy it
// has: plain and fused calls, warmed up once, then counted.
void calls_allocate_nothing(Backend backend) {
  constexpr int kWorld = 2, kTokens = 4, kHidden = 64, kCall = 2;  // the Lamport buffers hold 3 tokens with the route
  const auto errors = fiar_test::run_ranks(kWorld, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg{.max_token_num = kTokens, .hidden_dim = kHidden};
    // trtllm / mnnvl: a route for the calls of every size, so Strategy::Nccl runs on their NCCL engine.
    if (backend != Backend::Nccl) cfg.nccl_min_bytes = std::size_t{kTokens} * kHidden * sizeof(T);
    auto ws = fiar::make_workspace<T, fiar::HostPlatform>(boot, fiar_test::one_node(kWorld, rank), cfg, backend,
                                                          fiar_test::kSmallGrid);
    const std::size_t n = std::size_t{kTokens} * kHidden;
    std::vector<T> in(n, T(1.0f)), out(n), residual(n, T(0.5f)), residual_out(n), gamma(kHidden, T(1.0f)), norm(n);
    fiar::FusedArgs<T> fused;
    fused.in = in.data();
    fused.num_tokens = kCall;
    fused.residual_in = residual.data();
    fused.residual_out = residual_out.data();
    fused.gamma = gamma.data();
    fused.norm_out = norm.data();
    std::vector<Strategy> strategies{Strategy::Auto};
    if (backend != Backend::Nccl)
      strategies.insert(strategies.end(), {Strategy::OneShot, Strategy::TwoShot, Strategy::Nccl});
    auto calls = [&] {
      for (Strategy s : strategies) {
        ws.allreduce(in.data(), out.data(), kCall, nullptr, s);
        ws.run<Pattern::ResidualRmsNorm>(fused, nullptr, s);
      }
      ws.check();
    };
    calls();  // warm: the emulated grid's per-lane scratch, first-use caches
    const long counted = allocations_of(calls);
    FIAR_ENSURE(ws.has_nccl_route());
    if (counted != 0) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + std::to_string(counted) + " allocations in " +
                               std::to_string(2 * strategies.size()) + " calls on " +
                               std::string(fiar::to_string(backend)));
    }
    // The counter counts on this thread: a rejected call builds its message.
    long rejected = 0;
    try {
      rejected = allocations_of([&] { ws.allreduce(in.data(), out.data(), 0); });
    } catch (const std::invalid_argument&) {
      rejected = g_allocations;
    }
    FIAR_ENSURE(rejected > 0);
  });
  fiar_test::require_no_errors(errors);
}

}  // namespace

TEST_CASE("a warm workspace's calls allocate nothing on the caller's thread, on every engine", "[alloc]") {
  SECTION("trtllm: one-shot, two-shot and its NCCL route") { calls_allocate_nothing(Backend::Trtllm); }
  SECTION("mnnvl: one-shot, two-shot and its NCCL route") { calls_allocate_nothing(Backend::Mnnvl); }
  SECTION("nccl") { calls_allocate_nothing(Backend::Nccl); }
}
