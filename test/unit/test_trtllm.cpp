// SPDX-License-Identifier: Apache-2.0
// What is particular to the trtllm backend on the host emulator: buffer rotation and clearing over 300 calls, world
// sizes 1 to 16 and the topologies it refuses, its strategy table and sizing. What every backend does (results,
// aliasing, validation, creation, timeouts) is tested once for all in test_backends.cpp.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using fiar::Strategy;
using fiar_test::bits;
using fiar_test::HostWorkspace;
using fiar_test::kSmallGrid;
using fiar_test::one_node;
using fiar_test::require_no_errors;
using fiar_test::run_and_check;
using fiar_test::run_ranks;

TEMPLATE_TEST_CASE("300 consecutive calls: rotation, clearing, strategy switches, a large call after small ones",
                   "[trtllm]", float, __nv_bfloat16) {
  const int world = 4;
  // A tiny one-shot threshold makes Auto switch between the protocols as the token count varies.
  const fiar::WorkspaceConfig cfg{
      .max_token_num = 24, .hidden_dim = 16, .oneshot_max_bytes = 8 * 16 * sizeof(TestType)};
  const auto ran = run_and_check<TestType>(
      world, cfg, 300, [](int c) { return c % 50 == 49 ? 24 : 1 + (c * 7) % 13; }, [](int) { return Strategy::Auto; },
      false, /*specials=*/false);
  CHECK(std::count(ran.begin(), ran.end(), Strategy::OneShot) > 50);
  CHECK(std::count(ran.begin(), ran.end(), Strategy::TwoShot) > 50);
}

TEST_CASE("world size 1 copies the input", "[trtllm]") {
  auto errors = run_ranks(1, [](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<__half> ws(boot, one_node(1, rank), {.max_token_num = 3, .hidden_dim = 8}, kSmallGrid);
    const auto in = fiar_test::make_input<__half>(24, 0, 0);
    std::vector<__half> out(24);
    for (int i = 0; i < 5; ++i) ws.allreduce(in.data(), out.data(), 3);
    const auto expect = fiar_test::rank_order_sum<__half>({in}, 24);
    for (std::size_t i = 0; i < 24; ++i) FIAR_ENSURE(bits(out[i]) == bits(expect[i]));
  });
  require_no_errors(errors);
}

TEST_CASE("every world size from 1 to 16 reduces correctly", "[trtllm]") {
  for (int world = 1; world <= 16; ++world) {
    CAPTURE(world);
    run_and_check<float>(
        world, {.max_token_num = 3, .hidden_dim = 4, .oneshot_at_max_tokens = true}, 2, [](int c) { return 2 + c; },
        [](int c) { return c == 0 ? Strategy::OneShot : Strategy::TwoShot; });
  }
}

TEST_CASE("creation: the topology is checked before anything is allocated, on every rank alike", "[trtllm]") {
  SECTION("two nodes") {
    auto errors = run_ranks(4, [](int rank, fiar::InProcessBootstrap& boot) {
      HostWorkspace<float> ws(boot, fiar::Topology{.world_size = 4, .rank = rank, .node_count = 2},
                              {.max_token_num = 1, .hidden_dim = 4});
    });
    for (const auto& e : errors) {
      CHECK(e.find("'trtllm' cannot run on a group that spans 2 nodes") != std::string::npos);
    }
  }
  SECTION("world size 17") {
    auto errors = run_ranks(17, [](int rank, fiar::InProcessBootstrap& boot) {
      HostWorkspace<float> ws(boot, one_node(17, rank), {.max_token_num = 1, .hidden_dim = 4});
    });
    for (const auto& e : errors) CHECK(e.find("does not support world_size 17") != std::string::npos);
  }
}

TEST_CASE("strategy table and capacity", "[trtllm]") {
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(90, 8) == 128 * 1024);
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(100, 8) == 256 * 1024);
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(90, 2) == 32 * 1024 * 1024);
  STATIC_REQUIRE(fiar::choose_strategy(8, 4, 1 << 30, 0) == Strategy::OneShot);    // fewer tokens than ranks
  STATIC_REQUIRE(fiar::choose_strategy(1, 100, 1 << 30, 0) == Strategy::OneShot);  // a single rank
  STATIC_REQUIRE(fiar::choose_strategy(8, 64, 1024, 1024) == Strategy::OneShot);
  STATIC_REQUIRE(fiar::choose_strategy(8, 64, 1025, 1024) == Strategy::TwoShot);
  // required_bytes: three buffers, each a header of W call digests (16 bytes each) and room for max(one-shot at the
  // threshold, two-shot at max_token_num).
  const fiar::WorkspaceConfig cfg{.max_token_num = 64, .hidden_dim = 7168};
  const fiar::Topology t8 = one_node(8, 0, 90);
  const std::size_t row = 7168 * 2;
  const std::size_t oneshot_tokens = std::min<std::size_t>(128 * 1024 / row, 64);  // 9
  const std::size_t expect = 3 * (8 * 16 + std::max(8 * oneshot_tokens * row, (8 * 8 + 64) * row));
  CHECK(HostWorkspace<__nv_bfloat16>::required_bytes(t8, cfg) == expect);
  CHECK(HostWorkspace<__nv_bfloat16>::can_implement(t8, cfg));
  CHECK_FALSE(HostWorkspace<__nv_bfloat16>::can_implement(fiar::Topology{.world_size = 8, .node_count = 2}, cfg));
  CHECK(HostWorkspace<__nv_bfloat16>::why_not(t8, {.max_token_num = 64, .hidden_dim = 7}).find("hidden_dim = 7") !=
        std::string::npos);
}

// The push's and the results' negative-zero replacement: exactly the -0 elements become +0, for every 16-bit value in
// either half of a word (next to a few values in the other half) and for fp32's words around the sentinel.
TEST_CASE("sanitize replaces exactly the negative zeros, every 16-bit value in either half", "[trtllm]") {
  auto reference = [](std::uint32_t w) {
    if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
    if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
    return w;
  };
  int wrong = 0;
  for (std::uint32_t other : {0x0000u, 0x8000u, 0x7fffu, 0xffffu, 0x0001u, 0x8001u, 0x3c00u}) {
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
      const std::uint32_t low = (other << 16) | h, high = (h << 16) | other;
      wrong += fiar::exec::sanitize_word<2>(low) != reference(low) ? 1 : 0;
      wrong += fiar::exec::sanitize_word<2>(high) != reference(high) ? 1 : 0;
    }
  }
  CHECK(wrong == 0);
  STATIC_REQUIRE(fiar::exec::sanitize_word<4>(0x80000000u) == 0u);
  STATIC_REQUIRE(fiar::exec::sanitize_word<4>(0x80000001u) == 0x80000001u);
  STATIC_REQUIRE(fiar::exec::sanitize_word<2>(0x80008000u) == 0u);
}
