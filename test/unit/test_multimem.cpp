// SPDX-License-Identifier: Apache-2.0
// Strategy::Multimem, the in-switch reduction of the mnnvl backend, on the host emulator (the emulated switch sums the
// members in rank order in fp32): every pattern against the reference, bit-identical on every rank and with
// one-shot there; sequences mixing it with the Lamport strategies (they share the rotating buffers) and changing
// grids and ranks on different grids (the per-token barrier counters); a missing rank times out at the barrier; trtllm
// and nccl refuse it.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::MnnvlPolicy;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::kSmallGrid;
using fiar_test::one_node;
using fiar_test::run_ranks;
using fiar_test::Shape;

TEST_CASE("multimem: the strategy's name, and its place in the enumeration", "[multimem]") {
  CHECK(fiar::to_string(Strategy::Multimem) == "multimem");
  CHECK(fiar::is_valid(Strategy::Multimem));
  CHECK_FALSE(fiar::is_valid(static_cast<Strategy>(5)));
  CHECK_THROWS_WITH(fiar::check_strategy(static_cast<Strategy>(5)), Catch::Contains("multimem"));
}

TEMPLATE_TEST_CASE("multimem: every fused pattern matches the reference, world sizes 2 to 8", "[multimem]", float,
                   __half, __nv_bfloat16) {
  const int world = GENERATE(from_range(fiar_test::sizes_for({2, 3, 8}, {2, 3})));
  const int hidden = 16 * 19;  // an odd number of vectors: shares of unequal length
  const Shape s{world, world + 1, hidden};
  using fiar_test::run_and_check;
  run_and_check<Pattern::AllReduce, TestType, MnnvlPolicy>(s, Strategy::Multimem, false);
  run_and_check<Pattern::ResidualRmsNorm, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  run_and_check<Pattern::RmsNorm, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  run_and_check<Pattern::ResidualRmsNormPrePost, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  run_and_check<Pattern::ResidualRmsNormFp8, TestType, MnnvlPolicy>(s, Strategy::Multimem, false);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  run_and_check<Pattern::ResidualRmsNormFp8Group, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  run_and_check<Pattern::MoeFinalizeResidualRmsNorm, TestType, MnnvlPolicy>(s, Strategy::Multimem, true,
                                                                            fiar_test::QuantOptions::moe(8, true));
  run_and_check<Pattern::ResidualRmsNormMxfp8, TestType, MnnvlPolicy>({world, world + 1, 32 * 5}, Strategy::Multimem,
                                                                      true);
  if constexpr (sizeof(TestType) == 2) {
    run_and_check<Pattern::ResidualRmsNormNvfp4, TestType, MnnvlPolicy>(s, Strategy::Multimem, true);
  }
}

TEMPLATE_TEST_CASE("multimem: 60 calls mixing multimem, one-shot and two-shot at changing token counts", "[multimem]",
                   float, __nv_bfloat16) {
  const int world = 4;
  const fiar::WorkspaceConfig cfg{.max_token_num = 9, .hidden_dim = 64, .oneshot_at_max_tokens = true};
  const Strategy order[] = {Strategy::Multimem, Strategy::OneShot,  Strategy::Multimem,
                            Strategy::TwoShot,  Strategy::Multimem, Strategy::Multimem};
  const auto ran = fiar_test::run_and_check<TestType, MnnvlPolicy>(
      world, cfg, 60, [](int c) { return 1 + (c * 5) % 9; }, [&](int c) { return order[c % 6]; });
  int multimem = 0;
  for (Strategy s : ran) multimem += s == Strategy::Multimem ? 1 : 0;
  CHECK(multimem == 40);
}

TEST_CASE("multimem: 64 ranks", "[multimem]") {
  const fiar::WorkspaceConfig cfg{.max_token_num = 3, .hidden_dim = 1024};
  fiar_test::run_and_check<float, MnnvlPolicy>(
      fiar_test::kUnderTsan ? 16 : 64, cfg, 3, [](int c) { return 1 + c; }, [](int) { return Strategy::Multimem; });
}

TEST_CASE("multimem: a rank that never calls makes the others time out at the barrier", "[multimem]") {
  std::vector<fiar_test::AfterPeerStopped> seen(2);
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 2, .hidden_dim = 64, .timeout = 300ms};
    fiar::Workspace<MnnvlPolicy, float, fiar::HostPlatform> ws(boot, one_node(2, rank), cfg, kSmallGrid);
    std::vector<float> in(128, 1.0f), out(128);
    if (rank == 0) {
      seen[0] = fiar_test::after_peer_stopped(
          ws, [&] { ws.allreduce(in.data(), out.data(), 2, nullptr, Strategy::Multimem); });
    }
    boot.barrier();  // rank 1 keeps its workspace until rank 0 has given up
  });
  fiar_test::require_no_errors(errors);
  CAPTURE(seen[0].first);
  CHECK(seen[0].first.find("gave up after 300 ms") != std::string::npos);
  CHECK(seen[0].took < 10s);
  CHECK(!seen[0].later.empty());
  CHECK(seen[0].checked == seen[0].later);
}

TEST_CASE("multimem: trtllm and nccl refuse the strategy, naming mnnvl", "[multimem]") {
  std::vector<std::string> trtllm(2), nccl(2);
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 2, .hidden_dim = 64};
    std::vector<float> in(128, 1.0f), out(128);
    fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform> t(boot, one_node(2, rank), cfg, kSmallGrid);
    CHECK_FALSE(t.is_buffer_size_sufficient(2, Strategy::Multimem));
    trtllm[static_cast<std::size_t>(rank)] = fiar_test::thrown<std::invalid_argument>(
        [&] { t.allreduce(in.data(), out.data(), 2, nullptr, Strategy::Multimem); });
    fiar::Workspace<fiar::NcclPolicy, float, fiar::HostPlatform> n(boot, one_node(2, rank), cfg, kSmallGrid);
    nccl[static_cast<std::size_t>(rank)] = fiar_test::thrown<std::invalid_argument>(
        [&] { n.allreduce(in.data(), out.data(), 2, nullptr, Strategy::Multimem); });
    // Both still work afterwards: the refusal came before anything was launched.
    t.allreduce(in.data(), out.data(), 2);
    n.allreduce(in.data(), out.data(), 2);
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(trtllm[static_cast<std::size_t>(r)], nccl[static_cast<std::size_t>(r)]);
    CHECK(trtllm[static_cast<std::size_t>(r)].find("mnnvl") != std::string::npos);
    CHECK(!nccl[static_cast<std::size_t>(r)].empty());
  }
}

TEST_CASE("multimem: one rank in-switch, the other one-shot: mismatch_error on both, naming multimem", "[multimem]") {
  std::vector<std::string> seen(2);
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 2, .hidden_dim = 64, .timeout = 5s};
    fiar::Workspace<MnnvlPolicy, float, fiar::HostPlatform> ws(boot, one_node(2, rank), cfg, kSmallGrid);
    std::vector<float> in(128, 1.0f), out(128);
    seen[static_cast<std::size_t>(rank)] = fiar_test::thrown<fiar::mismatch_error>(
        [&] { ws.allreduce(in.data(), out.data(), 2, nullptr, rank == 0 ? Strategy::Multimem : Strategy::OneShot); });
  });
  fiar_test::require_no_errors(errors);
  for (const auto& s : seen) {
    CAPTURE(s);
    CHECK(s.find("strategy multimem") != std::string::npos);
    CHECK(s.find("strategy oneshot") != std::string::npos);
  }
}

TEST_CASE("multimem: WorkspaceConfig::multimem_min_bytes lets Auto take it from that size, on mnnvl only",
          "[multimem]") {
  const int world = 3, hidden = 64;
  const std::size_t row = hidden * sizeof(float);
  fiar::WorkspaceConfig cfg{.max_token_num = 8, .hidden_dim = hidden};
  cfg.multimem_min_bytes = 4 * row;  // 4 tokens and more
  const auto ran = fiar_test::run_and_check<float, MnnvlPolicy>(
      world, cfg, 16, [](int c) { return 1 + c % 8; }, [](int) { return Strategy::Auto; });
  for (std::size_t c = 0; c < ran.size(); ++c) {
    const int tokens = 1 + static_cast<int>(c) % 8;
    CAPTURE(c, tokens);
    CHECK((ran[c] == Strategy::Multimem) == (tokens >= 4));
  }
  // trtllm ignores it (the same configuration serves auto's fallback from mnnvl).
  const auto trtllm = fiar_test::run_and_check<float, fiar::TrtllmPolicy>(
      world, cfg, 8, [](int c) { return 1 + c; }, [](int) { return Strategy::Auto; });
  for (Strategy s : trtllm) CHECK(s != Strategy::Multimem);
  // A pool does not serve a request with another threshold from this workspace.
  fiar::WorkspaceConfig other = cfg;
  other.multimem_min_bytes = 8 * row;
  CHECK_FALSE(fiar::config_can_serve(cfg, other));
  CHECK(fiar::config_can_serve(cfg, cfg));
}

// The barrier counters are one per token and a rank arrives once per token, so ranks whose grids differ (SM counts,
// CudaPlatformOptions::max_blocks, ranks per GPU: here the emulator's blocks and clusters) still pair the same
// arrivals. With counters per cluster index this returned wrong sums on one rank and timed out on the other.
TEST_CASE("multimem: ranks with different grids pair their tokens (16 tokens, 2 vs 4 blocks, clusters 1 vs 2)",
          "[multimem]") {
  const int world = 2, tokens = 16, hidden = 256;
  const fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden};
  std::vector<fiar_test::Check<float>> checks(2);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::HostPlatformOptions grid = rank == 0 ? fiar::HostPlatformOptions{.blocks = 2, .lanes = 8, .cluster = 1}
                                                     : fiar::HostPlatformOptions{.blocks = 4, .lanes = 8, .cluster = 2};
    fiar::Workspace<MnnvlPolicy, float, fiar::HostPlatform> ws(boot, one_node(world, rank), cfg, grid);
    for (int call = 0; call < 4; ++call) {
      const int n = call % 2 == 0 ? tokens : 5;
      const std::size_t count = static_cast<std::size_t>(n) * hidden;
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<float>(count, r, call, true));
      std::vector<float> out(count);
      ws.allreduce(inputs[fiar_test::at(rank)].data(), out.data(), n, nullptr, Strategy::Multimem);
      checks[fiar_test::at(rank)].compare(inputs, out, count, world);
    }
    ws.check();
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(checks[fiar_test::at(r)].mismatches == 0);
    CHECK(checks[fiar_test::at(r)].out_of_bound == 0);
  }
}
