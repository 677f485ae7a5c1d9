// SPDX-License-Identifier: Apache-2.0
// The strategy table across backends: its rows (default_strategy_thresholds) and how a workspace resolves and agrees
// on one; the NCCL route of the trtllm and mnnvl workspaces (calls from nccl_min_bytes handed to a nccl workspace of
// the same group) on the host emulator, whose NCCL is a rank-order fp32 reduction: so a routed call is bit-identical
// to one-shot, every pattern and dtype, mixed with the Lamport strategies in one sequence; a route that is not there
// is refused by name; ranks that disagree fail at creation, or raise mismatch_error when they route one call
// differently.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../common/cases.hpp"
#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Backend;
using fiar::Interconnect;
using fiar::MnnvlPolicy;
using fiar::NcclPolicy;
using fiar::Pattern;
using fiar::Strategy;
using fiar::StrategyThresholds;
using fiar::TrtllmPolicy;
using fiar_test::kSmallGrid;
using fiar_test::one_node;
using fiar_test::run_ranks;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

template <class T, class Policy>
using HostWs = fiar_test::HostWorkspace<T, Policy>;

fiar::Topology with_interconnect(int world, int rank, int arch, Interconnect i) {
  fiar::Topology t = one_node(world, rank, arch);
  t.interconnect = i;
  return t;
}

}  // namespace

TEST_CASE("routes: the strategy Nccl, its name and its place in the enumeration", "[routes]") {
  CHECK(fiar::to_string(Strategy::Nccl) == "nccl");
  CHECK(fiar::is_valid(Strategy::Nccl));
  CHECK_FALSE(fiar::is_valid(static_cast<Strategy>(5)));
  CHECK_THROWS_WITH(fiar::check_strategy(static_cast<Strategy>(5)), Catch::Contains("nccl"));
}

TEST_CASE("routes: the built-in table's rows", "[routes]") {
  for (Backend b : {Backend::Trtllm, Backend::Mnnvl}) {
    for (int arch : {0, 90, 100, 120}) {
      std::size_t previous = fiar::never;
      for (int world = 1; world <= 72; ++world) {
        CAPTURE(fiar::to_string(b), arch, world);
        const StrategyThresholds nv = fiar::default_strategy_thresholds(b, arch, world, Interconnect::NvLink);
        // The one-shot threshold is default_oneshot_max_bytes (the model's crossover, scripts/model --table).
        CHECK(nv.oneshot_max_bytes == fiar::default_oneshot_max_bytes(b, arch, world));
        // The in-switch reduction stays off until measured.
        CHECK(nv.multimem_min_bytes == fiar::never);
        // Unknown is NVLink's row; PCIe never hands a size to NCCL (the model finds no crossover there).
        CHECK(fiar::default_strategy_thresholds(b, arch, world, Interconnect::Unknown) == nv);
        CHECK(fiar::default_strategy_thresholds(b, arch, world, Interconnect::Pcie).nccl_min_bytes == fiar::never);
        // A single rank has nothing to hand over; more ranks hand over no later than fewer (NCCL's NVLS gains with
        // the world size, the Lamport protocols lose).
        if (world == 1) CHECK(nv.nccl_min_bytes == fiar::never);
        CHECK(nv.nccl_min_bytes <= previous);
        previous = nv.nccl_min_bytes;
        // NCCL takes over only beyond the one-shot range, and at a size a real call can have (a power of two).
        if (nv.nccl_min_bytes != fiar::never) {
          CHECK(nv.nccl_min_bytes > nv.oneshot_max_bytes);
          CHECK((nv.nccl_min_bytes & (nv.nccl_min_bytes - 1)) == 0);
        }
        CHECK(nv.nccl_symmetric_max_bytes > 0);
      }
    }
  }
  // The nccl backend's row has no Lamport step.
  const StrategyThresholds n = fiar::default_strategy_thresholds(Backend::Nccl, 90, 8, Interconnect::NvLink);
  CHECK(n.nccl_min_bytes == fiar::never);
  CHECK(n.multimem_min_bytes == fiar::never);
}

TEST_CASE("routes: choose_strategy over a full row", "[routes]") {
  constexpr StrategyThresholds row{
      .oneshot_max_bytes = 64 * KiB, .multimem_min_bytes = 1 * MiB, .nccl_min_bytes = 16 * MiB};
  using fiar::choose_strategy;
  STATIC_REQUIRE(choose_strategy(row, 8, 8, 64 * KiB, true, true) == Strategy::OneShot);
  STATIC_REQUIRE(choose_strategy(row, 8, 64, 512 * KiB, true, true) == Strategy::TwoShot);
  STATIC_REQUIRE(choose_strategy(row, 8, 64, 1 * MiB, true, true) == Strategy::Multimem);
  STATIC_REQUIRE(choose_strategy(row, 8, 64, 1 * MiB, false, true) == Strategy::TwoShot);  // no multicast
  STATIC_REQUIRE(choose_strategy(row, 8, 1024, 16 * MiB, true, true) == Strategy::Nccl);
  STATIC_REQUIRE(choose_strategy(row, 8, 1024, 16 * MiB, true, false) == Strategy::Multimem);  // no route
  STATIC_REQUIRE(choose_strategy(row, 8, 1024, 16 * MiB, false, false) == Strategy::TwoShot);
  STATIC_REQUIRE(choose_strategy(row, 1, 1024, 16 * MiB, true, true) == Strategy::OneShot);  // a single rank
  STATIC_REQUIRE(choose_strategy(row, 8, 4, 16 * MiB, true, true) == Strategy::Nccl);        // the bytes decide first
  // A row without steps beyond the table is the two-argument rule.
  constexpr StrategyThresholds plain{.oneshot_max_bytes = 1024};
  STATIC_REQUIRE(choose_strategy(plain, 8, 64, 1025, true, true) == choose_strategy(8, 64, 1025, 1024));
}

TEST_CASE("routes: strategy_thresholds puts the caller's values over the row, as each backend applies them",
          "[routes]") {
  const fiar::Topology topo = with_interconnect(8, 0, 90, Interconnect::NvLink);
  const fiar::WorkspaceConfig plain{.max_token_num = 8, .hidden_dim = 64};
  CHECK(fiar::strategy_thresholds(Backend::Trtllm, topo, plain) ==
        fiar::default_strategy_thresholds(Backend::Trtllm, 90, 8, Interconnect::NvLink));
  const fiar::WorkspaceConfig given{.max_token_num = 8,
                                    .hidden_dim = 64,
                                    .oneshot_max_bytes = 100,
                                    .multimem_min_bytes = 200,
                                    .nccl_min_bytes = 300,
                                    .nccl_symmetric_max_bytes = 400};
  const StrategyThresholds m = fiar::strategy_thresholds(Backend::Mnnvl, topo, given);
  CHECK(m == StrategyThresholds{100, 200, 300, 400});
  // trtllm has no in-switch reduction; nccl only the window's bound.
  CHECK(fiar::strategy_thresholds(Backend::Trtllm, topo, given) == StrategyThresholds{100, fiar::never, 300, 400});
  CHECK(fiar::strategy_thresholds(Backend::Nccl, topo, given) == StrategyThresholds{0, fiar::never, fiar::never, 400});
  // The interconnect is part of the key.
  const fiar::Topology pcie = with_interconnect(2, 0, 90, Interconnect::Pcie);
  CHECK(fiar::strategy_thresholds(Backend::Trtllm, pcie, plain).nccl_min_bytes == fiar::never);
  // The pool reuses a workspace only for the same thresholds.
  fiar::WorkspaceConfig other = given;
  other.nccl_min_bytes = 301;
  CHECK(fiar::config_can_serve(given, given));
  CHECK_FALSE(fiar::config_can_serve(given, other));
  other = given;
  other.nccl_symmetric_max_bytes = std::nullopt;
  CHECK_FALSE(fiar::config_can_serve(given, other));
}

TEMPLATE_TEST_CASE(
    "routes: calls from nccl_min_bytes take NCCL inside trtllm and mnnvl workspaces, bit-identical to "
    "fiar's rank order, mixed with the Lamport strategies",
    "[routes]", float, __half, __nv_bfloat16) {
  const int world = GENERATE(2, 3, 4);
  constexpr int hidden = 64, max_tokens = 12, from_tokens = 8;
  const fiar::WorkspaceConfig cfg{.max_token_num = max_tokens,
                                  .hidden_dim = hidden,
                                  .oneshot_max_bytes = 2 * hidden * sizeof(TestType),
                                  .nccl_min_bytes = from_tokens * hidden * sizeof(TestType)};
  const auto tokens_of = [](int c) { return 1 + (c * 7) % max_tokens; };
  const auto auto_strategy = [](int) { return Strategy::Auto; };
  auto expect = [&](const std::vector<Strategy>& ran, bool multicast) {
    REQUIRE(ran.size() == 36);
    int routed = 0;
    for (int c = 0; c < 36; ++c) {
      CAPTURE(c, tokens_of(c));
      const int t = tokens_of(c);
      const Strategy want = t >= from_tokens      ? Strategy::Nccl
                            : t <= 2 || t < world ? Strategy::OneShot
                                                  : Strategy::TwoShot;
      CHECK(ran[static_cast<std::size_t>(c)] == want);
      routed += ran[static_cast<std::size_t>(c)] == Strategy::Nccl ? 1 : 0;
    }
    CHECK(routed == 15);  // tokens 8..12 of every cycle of 12
    (void)multicast;
  };
  expect(fiar_test::run_and_check<TestType, TrtllmPolicy>(world, cfg, 36, tokens_of, auto_strategy), false);
  expect(fiar_test::run_and_check<TestType, MnnvlPolicy>(world, cfg, 36, tokens_of, auto_strategy), true);
  // Forced: the route for every size, and in place.
  const auto ran = fiar_test::run_and_check<TestType, TrtllmPolicy>(
      world, cfg, 12, tokens_of, [](int) { return Strategy::Nccl; }, /*in_place=*/true);
  for (Strategy s : ran) CHECK(s == Strategy::Nccl);
}

TEMPLATE_TEST_CASE("routes: every fused pattern through the NCCL route matches the reference", "[routes]", float,
                   __half, __nv_bfloat16) {
  const fiar_test::Shape s{4, 5, 16 * 19};
  using fiar_test::run_and_check;
  run_and_check<Pattern::AllReduce, TestType, TrtllmPolicy>(s, Strategy::Nccl, false);
  run_and_check<Pattern::ResidualRmsNorm, TestType, TrtllmPolicy>(s, Strategy::Nccl, true);
  run_and_check<Pattern::RmsNorm, TestType, MnnvlPolicy>(s, Strategy::Nccl, true);
  run_and_check<Pattern::ResidualRmsNormPrePost, TestType, TrtllmPolicy>(s, Strategy::Nccl, true);
  run_and_check<Pattern::ResidualRmsNormFp8, TestType, MnnvlPolicy>(s, Strategy::Nccl, false);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, TestType, TrtllmPolicy>(s, Strategy::Nccl, true);
  run_and_check<Pattern::ResidualRmsNormFp8Group, TestType, MnnvlPolicy>(s, Strategy::Nccl, true);
  run_and_check<Pattern::MoeFinalizeAllReduce, TestType, TrtllmPolicy>(s, Strategy::Nccl, false,
                                                                       fiar_test::QuantOptions::moe(8, true));
  run_and_check<Pattern::MoeFinalizeResidualRmsNorm, TestType, MnnvlPolicy>(
      s, Strategy::Nccl, true, fiar_test::QuantOptions::moe(10, false, 2.5f));
  run_and_check<Pattern::ResidualRmsNormMxfp8, TestType, TrtllmPolicy>({4, 5, 32 * 5}, Strategy::Nccl, false);
  if constexpr (sizeof(TestType) == 2) {
    run_and_check<Pattern::ResidualRmsNormNvfp4, TestType, MnnvlPolicy>(s, Strategy::Nccl, true);
  }
}

TEST_CASE("routes: the fused outputs of a routed call are bit-identical to one-shot's", "[routes]") {
  const fiar_test::Shape s{3, 4, 16 * 8};
  using T = __nv_bfloat16;
  const auto routed = fiar_test::run_pattern<Pattern::ResidualRmsNormFp8Dynamic, T, TrtllmPolicy>(
      s, Strategy::Nccl, true, fiar::ScaleLayout::Swizzled128x4, 0.0f, 0.75f, false);
  const auto oneshot = fiar_test::run_pattern<Pattern::ResidualRmsNormFp8Dynamic, T, TrtllmPolicy>(
      s, Strategy::OneShot, true, fiar::ScaleLayout::Swizzled128x4, 0.0f, 0.75f, false);
  auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [](T x, T y) { return fiar_test::bits(x) == fiar_test::bits(y); });
  };
  for (std::size_t r = 0; r < routed.size(); ++r) {
    CAPTURE(r);
    CHECK(same(routed[r].residual_out, oneshot[r].residual_out));
    CHECK(same(routed[r].norm_out, oneshot[r].norm_out));
    CHECK(routed[r].quant == oneshot[r].quant);
  }
}

TEST_CASE("routes: with the route, the Lamport buffers hold only the calls below nccl_min_bytes", "[routes]") {
  const int world = 3;
  constexpr int hidden = 64;
  for (const bool oneshot_at_max : {false, true}) {
    CAPTURE(oneshot_at_max);
    fiar::WorkspaceConfig cfg{.max_token_num = 12,
                              .hidden_dim = hidden,
                              .oneshot_max_bytes = 2 * hidden * sizeof(float),
                              .oneshot_at_max_tokens = oneshot_at_max,
                              .nccl_min_bytes = 8 * hidden * sizeof(float)};
    fiar::WorkspaceConfig without = cfg;
    without.nccl_min_bytes = fiar::never;
    auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
      HostWs<float, TrtllmPolicy> ws(boot, one_node(world, rank), cfg, kSmallGrid);
      HostWs<float, TrtllmPolicy> full(boot, one_node(world, rank), without, kSmallGrid);
      FIAR_ENSURE(ws.has_nccl_route() && !full.has_nccl_route());
      // 7 tokens are the largest Lamport call; 8 and more are the route's.
      FIAR_ENSURE(ws.is_buffer_size_sufficient(7, Strategy::TwoShot));
      FIAR_ENSURE(!ws.is_buffer_size_sufficient(12, Strategy::TwoShot));
      FIAR_ENSURE(ws.is_buffer_size_sufficient(8, Strategy::TwoShot) == oneshot_at_max);  // room left by one-shot's
      FIAR_ENSURE(ws.is_buffer_size_sufficient(12, Strategy::Nccl) && ws.is_buffer_size_sufficient(12));
      FIAR_ENSURE(full.is_buffer_size_sufficient(12, Strategy::TwoShot));
      FIAR_ENSURE(ws.is_buffer_size_sufficient(7, Strategy::OneShot) == oneshot_at_max);
      FIAR_ENSURE(full.is_buffer_size_sufficient(12, Strategy::OneShot) == oneshot_at_max);
      std::vector<float> in(12 * hidden, 1.0f), out(12 * hidden, -1.0f);
      const std::string e = fiar_test::thrown<std::invalid_argument>(
          [&] { ws.allreduce(in.data(), out.data(), 12, nullptr, Strategy::TwoShot); });
      FIAR_ENSURE(e.find("Lamport buffers hold at most 7 tokens") != std::string::npos);
      FIAR_ENSURE(out[0] == -1.0f);
      // Both workspaces reduce every size, through their own paths.
      for (int tokens : {7, 8, 12}) {
        ws.allreduce(in.data(), out.data(), tokens);
        FIAR_ENSURE(out[0] == 3.0f && out[static_cast<std::size_t>(tokens) * hidden - 1] == 3.0f);
        FIAR_ENSURE(ws.last_strategy() == (tokens >= 8 ? Strategy::Nccl : Strategy::TwoShot));
        full.allreduce(in.data(), out.data(), tokens);
        FIAR_ENSURE(full.last_strategy() == Strategy::TwoShot);
      }
    });
    fiar_test::require_no_errors(errors);
  }
  // nccl_min_bytes = 0: every call is the route's, and the Lamport buffers hold one token.
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = hidden, .nccl_min_bytes = 0};
    HostWs<float, MnnvlPolicy> ws(boot, one_node(2, rank), cfg, kSmallGrid);
    FIAR_ENSURE(ws.strategy_for(1) == Strategy::Nccl && ws.strategy_for(4) == Strategy::Nccl);
    FIAR_ENSURE(ws.is_buffer_size_sufficient(1, Strategy::OneShot) &&
                !ws.is_buffer_size_sufficient(2, Strategy::OneShot));
  });
  fiar_test::require_no_errors(errors);
}

TEST_CASE("routes: a workspace without the route says why, and refuses Strategy::Nccl by name", "[routes]") {
  struct Case {
    int world;
    std::optional<std::size_t> from;
    const char* reason;
  };
  for (const Case& c : {Case{4, std::nullopt, "no call reaches nccl_min_bytes"}, Case{4, fiar::never, "no NCCL step"},
                        Case{1, 64, "single rank"}}) {
    CAPTURE(c.world, c.reason);
    const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 64, .nccl_min_bytes = c.from};
    auto errors = run_ranks(c.world, [&](int rank, fiar::InProcessBootstrap& boot) {
      HostWs<float, TrtllmPolicy> ws(boot, one_node(c.world, rank), cfg, kSmallGrid);
      FIAR_ENSURE(!ws.has_nccl_route());
      FIAR_ENSURE(ws.nccl_route_reason().find(c.reason) != std::string::npos);
      FIAR_ENSURE(!ws.is_buffer_size_sufficient(2, Strategy::Nccl));
      FIAR_ENSURE(ws.strategy_for(4) != Strategy::Nccl);
      std::vector<float> in(4 * 64, 1.0f), out(4 * 64, -1.0f);
      const std::string e = fiar_test::thrown<std::invalid_argument>(
          [&] { ws.allreduce(in.data(), out.data(), 4, nullptr, Strategy::Nccl); });
      FIAR_ENSURE(e.find("strategy nccl needs the workspace's NCCL route") != std::string::npos);
      FIAR_ENSURE(e.find("nccl_min_bytes") != std::string::npos);
      FIAR_ENSURE(out[0] == -1.0f);            // nothing ran
      ws.allreduce(in.data(), out.data(), 4);  // and the workspace still works
      FIAR_ENSURE(out[0] == static_cast<float>(c.world));
    });
    fiar_test::require_no_errors(errors);
  }
}

TEST_CASE("routes: every rank resolves the same row and reports it; the nccl backend takes Strategy::Nccl",
          "[routes]") {
  const int world = 4;
  const fiar::WorkspaceConfig cfg{.max_token_num = 8, .hidden_dim = 64, .nccl_min_bytes = 4 * 64 * sizeof(float)};
  std::vector<StrategyThresholds> seen(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWs<float, MnnvlPolicy> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    seen[fiar_test::at(rank)] = ws.strategy_thresholds();
    FIAR_ENSURE(ws.has_nccl_route() && ws.nccl_route_reason().empty());
    FIAR_ENSURE(ws.is_buffer_size_sufficient(8, Strategy::Nccl));
    FIAR_ENSURE(ws.strategy_for(3) != Strategy::Nccl && ws.strategy_for(4) == Strategy::Nccl);
    HostWs<float, NcclPolicy> nccl(boot, fiar_test::anywhere(world, rank, 90), cfg, kSmallGrid);
    FIAR_ENSURE(nccl.has_nccl_route());
    FIAR_ENSURE(nccl.strategy_thresholds().nccl_min_bytes == fiar::never);
    std::vector<float> in(8 * 64, 2.0f), out(8 * 64, 0.0f);
    nccl.allreduce(in.data(), out.data(), 8, nullptr, Strategy::Nccl);
    FIAR_ENSURE(out[0] == 2.0f * world);
    const std::string e = fiar_test::thrown<std::invalid_argument>(
        [&] { nccl.allreduce(in.data(), out.data(), 8, nullptr, Strategy::OneShot); });
    FIAR_ENSURE(e.find("Strategy::Auto (or Nccl)") != std::string::npos);
  });
  fiar_test::require_no_errors(errors);
  for (const auto& t : seen) {
    CHECK(t == seen[0]);
    CHECK(t == fiar::strategy_thresholds(Backend::Mnnvl, one_node(world, 0), cfg));
  }
}

TEST_CASE("routes: ranks whose thresholds differ fail the creation on every rank, naming the value", "[routes]") {
  const int world = 3;
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg{.max_token_num = 8, .hidden_dim = 64};
    if (rank == 1) cfg.nccl_min_bytes = 1024;
    HostWs<float, TrtllmPolicy> ws(boot, one_node(world, rank), cfg, kSmallGrid);
  });
  for (const std::string& e : errors) {
    CHECK_THAT(e, Catch::Contains("configurations differ") && Catch::Contains("nccl_min_bytes 1024"));
  }
}

namespace {

// What each rank saw when the ranks made one call with different strategies (rank r with strategies[r] and
// tokens[r]): the mismatch_error of the call (and how long it took), then of a later call and of check().
struct Split {
  std::string first, later, checked;
  std::chrono::steady_clock::duration took{};
};
template <class Policy>
std::vector<Split> split_call(const std::vector<Strategy>& strategies, const std::vector<int>& tokens) {
  const int world = static_cast<int>(strategies.size());
  // A timeout far above the bound the test checks: a split that ended in a timeout would fail it.
  const fiar::WorkspaceConfig cfg{
      .max_token_num = 8, .hidden_dim = 64, .timeout = 20s, .nccl_min_bytes = 4 * 64 * sizeof(float)};
  std::vector<Split> seen(static_cast<std::size_t>(world));
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWs<float, Policy> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    std::vector<float> in(8 * 64, 1.0f), out(8 * 64);
    ws.allreduce(in.data(), out.data(), 4, nullptr, Strategy::Nccl);  // a routed call that matches, first
    ws.allreduce(in.data(), out.data(), 2);
    Split& mine = seen[fiar_test::at(rank)];
    auto call = [&] {
      ws.allreduce(in.data(), out.data(), tokens[fiar_test::at(rank)], nullptr, strategies[fiar_test::at(rank)]);
    };
    const auto start = std::chrono::steady_clock::now();
    mine.first = fiar_test::thrown<fiar::mismatch_error>(call);
    mine.took = std::chrono::steady_clock::now() - start;
    mine.later = fiar_test::thrown<fiar::mismatch_error>(call);
    mine.checked = fiar_test::thrown<fiar::mismatch_error>([&] { ws.check(); });
  });
  fiar_test::require_no_errors(errors);
  return seen;
}

}  // namespace

TEST_CASE("routes: a call that ranks route differently raises mismatch_error on every rank within a second",
          "[routes]") {
  const std::string backend = GENERATE(as<std::string>{}, "trtllm", "mnnvl");
  // Ranks 0 and 1 hand the call to NCCL, rank 2 runs it on the Lamport buffers: the same 3 tokens with a strategy
  // forced on every rank, or Auto on every rank with 4 tokens (the route's) on ranks 0 and 1 and 3 on rank 2.
  const Strategy other = GENERATE(Strategy::TwoShot, Strategy::OneShot, Strategy::Multimem, Strategy::Auto);
  if (other == Strategy::Multimem && backend != "mnnvl") return;
  const bool forced = other != Strategy::Auto;
  CAPTURE(backend, fiar::to_string(other));
  const Strategy routed = forced ? Strategy::Nccl : Strategy::Auto;
  const std::vector<Strategy> strategies{routed, routed, other};
  const std::vector<int> tokens{forced ? 3 : 4, forced ? 3 : 4, 3};
  const int other_tokens = 3;
  const auto seen =
      backend == "mnnvl" ? split_call<MnnvlPolicy>(strategies, tokens) : split_call<TrtllmPolicy>(strategies, tokens);
  const std::string other_digest = "num_tokens " + std::to_string(other_tokens) + ", pattern allreduce, strategy " +
                                   std::string(other == Strategy::Auto ? "oneshot" : fiar::to_string(other));
  for (std::size_t r = 0; r < seen.size(); ++r) {
    CAPTURE(r, seen[r].first);
    // Every rank names the routed call's digest ({..., strategy nccl}) against the other one.
    CHECK_THAT(seen[r].first, Catch::Contains("strategy nccl") && Catch::Contains(other_digest));
    CHECK(seen[r].took < 1s);
    CHECK(seen[r].later == seen[r].first);
    CHECK(seen[r].checked == seen[r].first);
  }
}

TEST_CASE("routes: after its NCCL route failed, a workspace launches nothing, not even a Lamport-sized call",
          "[routes]") {
  const int world = 2;
  // Without verify_calls a routed call has no digest exchange on the Lamport buffers: the route alone waits.
  const fiar::WorkspaceConfig cfg{.max_token_num = 8,
                                  .hidden_dim = 64,
                                  .timeout = 300ms,
                                  .verify_calls = false,
                                  .nccl_min_bytes = 4 * 64 * sizeof(float)};
  std::string routed, after;
  std::chrono::steady_clock::duration took{};
  std::atomic<bool> done{false};
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWs<float, TrtllmPolicy> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    std::vector<float> in(8 * 64, 1.0f), out(8 * 64);
    if (rank == 1) {  // rank 1 makes no call: rank 0's routed call times out
      while (!done) std::this_thread::sleep_for(5ms);
      return;
    }
    try {
      ws.allreduce(in.data(), out.data(), 4, nullptr, Strategy::Nccl);
    } catch (const fiar::timeout_error& e) {
      routed = e.what();
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      ws.allreduce(in.data(), out.data(), 1);  // one-shot: it would wait for rank 1 the whole timeout if launched
    } catch (const fiar::timeout_error& e) {
      after = e.what();
    }
    took = std::chrono::steady_clock::now() - start;
    done = true;
  });
  fiar_test::require_no_errors(errors);
  CHECK_THAT(routed, Catch::Contains("nccl all-reduce on rank 0 gave up after 300 ms"));
  CHECK(after == routed);
  CHECK(took < 150ms);
}
