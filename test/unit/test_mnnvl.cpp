// SPDX-License-Identifier: Apache-2.0
// What is particular to the mnnvl backend on the host emulator: the Lamport protocols over the emulated multicast
// object (a store through the multicast view lands in every rank's region) at 32 and 64 ranks, beyond trtllm's 16,
// long Auto sequences, every fused pattern up to 16 ranks, multicast traffic counted per protocol, creation failures
// when multicast is missing, its strategy table. What every backend does is tested once for all in
// test_backends.cpp.
#include <unistd.h>
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <string>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using fiar::MnnvlPolicy;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::kSmallGrid;
using fiar_test::one_node;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;
using fiar_test::Shape;

template <class T>
using MnnvlWorkspace = fiar::Workspace<MnnvlPolicy, T, fiar::HostPlatform>;

TEST_CASE("mnnvl: 32 and 64 ranks, beyond trtllm's 16", "[mnnvl]") {
  const int world = GENERATE(from_range(fiar_test::sizes_for({32, 64}, {32})));
  CAPTURE(world);
  const fiar::WorkspaceConfig cfg{.max_token_num = world + 3, .hidden_dim = 8, .oneshot_at_max_tokens = true};
  const std::vector<int> tokens = {2, world + 3};
  const std::vector<Strategy> strategies = {Strategy::OneShot, Strategy::TwoShot};
  fiar_test::run_and_check<float, MnnvlPolicy>(
      world, cfg, 2, [&](int c) { return tokens[static_cast<std::size_t>(c)]; },
      [&](int c) { return strategies[static_cast<std::size_t>(c)]; });
}

TEMPLATE_TEST_CASE("mnnvl: 200 consecutive calls with Auto switching strategies", "[mnnvl]", float, __nv_bfloat16) {
  const int world = 4;
  const fiar::WorkspaceConfig cfg{
      .max_token_num = 24, .hidden_dim = 16, .oneshot_max_bytes = 8 * 16 * sizeof(TestType)};
  const auto ran = fiar_test::run_and_check<TestType, MnnvlPolicy>(
      world, cfg, 200, [](int c) { return 1 + (c * 7) % 24; }, [](int) { return Strategy::Auto; });
  int oneshot = 0, twoshot = 0;
  for (Strategy s : ran) (s == Strategy::OneShot ? oneshot : twoshot)++;
  CHECK(oneshot > 20);
  CHECK(twoshot > 20);
}

TEMPLATE_TEST_CASE("mnnvl: every fused pattern, both strategies, world sizes 2 to 16", "[mnnvl]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(from_range(fiar_test::sizes_for({2, 4, 8, 16}, {2, 8})));
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  // several vectors per lane; an odd multiple of 16
  const int hidden = GENERATE(from_range(fiar_test::sizes_for({512, 16 * 19}, {16 * 19})));
  const Shape s{world, world + 1, hidden};
  using fiar_test::run_and_check;
  run_and_check<Pattern::AllReduce, TestType, MnnvlPolicy>(s, strategy, false);
  run_and_check<Pattern::ResidualRmsNorm, TestType, MnnvlPolicy>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8, TestType, MnnvlPolicy>(s, strategy, false);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, TestType, MnnvlPolicy>(s, strategy, true);
  if constexpr (sizeof(TestType) == 2) {
    run_and_check<Pattern::ResidualRmsNormNvfp4, TestType, MnnvlPolicy>(s, strategy, true);
    run_and_check<Pattern::ResidualRmsNormNvfp4, TestType, MnnvlPolicy>(s, strategy, false, fiar::ScaleLayout::Linear);
  }
}

TEST_CASE("mnnvl: each value every rank needs goes out as one multicast store", "[mnnvl]") {
  // One-shot: every rank multicasts each of its vectors once. Two-shot: only owners multicast, once per
  // reduced vector (the scatter to owners is unicast). trtllm never multicasts.
  const int world = 4, hidden = 64, tokens = 10;
  const int vecs = hidden * static_cast<int>(sizeof(float)) / 16;
  const fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
  std::vector<std::uint32_t> after_oneshot(world), after_twoshot(world), trtllm(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    MnnvlWorkspace<float> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    std::vector<float> data(static_cast<std::size_t>(tokens) * hidden, 1.0f);
    ws.allreduce(data.data(), data.data(), tokens, nullptr, Strategy::OneShot);
    after_oneshot[static_cast<std::size_t>(rank)] = ws.platform().multicast_stores();
    ws.allreduce(data.data(), data.data(), tokens, nullptr, Strategy::TwoShot);
    after_twoshot[static_cast<std::size_t>(rank)] = ws.platform().multicast_stores();
    fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform> tw(boot, one_node(world, rank), cfg, kSmallGrid);
    tw.allreduce(data.data(), data.data(), tokens, nullptr, Strategy::OneShot);
    trtllm[static_cast<std::size_t>(rank)] = tw.platform().multicast_stores();
  });
  require_no_errors(errors);
  const int chunk = (tokens + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    // Each call also multicasts this rank's call digest once.
    CHECK(after_oneshot[static_cast<std::size_t>(r)] == static_cast<std::uint32_t>(tokens * vecs + 1));
    const int owned = std::max(0, std::min(chunk, tokens - r * chunk));
    CHECK(after_twoshot[static_cast<std::size_t>(r)] - after_oneshot[static_cast<std::size_t>(r)] ==
          static_cast<std::uint32_t>(owned * vecs + 1));
    CHECK(trtllm[static_cast<std::size_t>(r)] == 0u);
  }
}

TEST_CASE("mnnvl: creation needs multicast in the topology and on the machine, on every rank alike", "[mnnvl]") {
  SECTION("a topology without multicast is rejected before anything is allocated") {
    auto errors = run_ranks(4, [](int rank, fiar::InProcessBootstrap& boot) {
      fiar::Topology t = one_node(4, rank);
      t.multicast_supported = false;
      MnnvlWorkspace<float> ws(boot, t, {.max_token_num = 2, .hidden_dim = 4});
    });
    for (const auto& e : errors) CHECK(e.find("multicast") != std::string::npos);
  }
  SECTION("a machine whose multicast setup fails: fiar::multicast_error on every rank, naming the rank") {
    std::vector<int> caught(3, 0);
    auto errors = run_ranks(3, [&](int rank, fiar::InProcessBootstrap& boot) {
      fiar::HostPlatformOptions options = kSmallGrid;
      options.multicast = rank != 1;
      try {
        MnnvlWorkspace<float> ws(boot, one_node(3, rank), {.max_token_num = 2, .hidden_dim = 4}, options);
      } catch (const fiar::multicast_error& e) {
        caught[static_cast<std::size_t>(rank)] = 1;
        throw;
      }
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, errors[static_cast<std::size_t>(r)]);
      CHECK(caught[static_cast<std::size_t>(r)] == 1);
      CHECK(errors[static_cast<std::size_t>(r)].find("rank 1 runs on an (emulated) machine without multicast") !=
            std::string::npos);
    }
  }
  SECTION("world size 65 is beyond the protocol") {
    CHECK_FALSE(MnnvlWorkspace<float>::can_implement(one_node(65, 0), {.max_token_num = 1, .hidden_dim = 4}));
    CHECK(MnnvlWorkspace<float>::can_implement(one_node(64, 0), {.max_token_num = 1, .hidden_dim = 4}));
  }
  SECTION("across nodes (with fabric handles) mnnvl can run; trtllm cannot") {
    const fiar::Topology two_nodes{.world_size = 8,
                                   .rank = 0,
                                   .node_count = 2,
                                   .multicast_supported = true,
                                   .fabric_handles_supported = true,
                                   .arch = 100};
    CHECK(MnnvlWorkspace<float>::can_implement(two_nodes, {.max_token_num = 4, .hidden_dim = 8}));
    CHECK_FALSE(fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform>::can_implement(
        two_nodes, {.max_token_num = 4, .hidden_dim = 8}));
  }
}

TEST_CASE("mnnvl: strategy table and capacity", "[mnnvl]") {
  // Auto runs one-shot while W x message <= 1 MiB (per-rank threshold 1 MiB / W).
  CHECK(fiar::default_oneshot_max_bytes(fiar::Backend::Mnnvl, 90, 8) == 128u * 1024u);
  CHECK(fiar::default_oneshot_max_bytes(fiar::Backend::Mnnvl, 100, 64) == 16u * 1024u);
  const fiar::WorkspaceConfig cfg{.max_token_num = 64, .hidden_dim = 7168};
  auto errors = run_ranks(8, [&](int rank, fiar::InProcessBootstrap& boot) {
    MnnvlWorkspace<__nv_bfloat16> ws(boot, one_node(8, rank), cfg, kSmallGrid);
    const int threshold_tokens = static_cast<int>(128 * 1024 / (7168 * 2));  // 9
    FIAR_ENSURE(ws.strategy_for(threshold_tokens) == Strategy::OneShot);
    FIAR_ENSURE(ws.strategy_for(threshold_tokens + 1) == Strategy::TwoShot);
    FIAR_ENSURE(ws.is_buffer_size_sufficient(64));
    FIAR_ENSURE(ws.is_buffer_size_sufficient(threshold_tokens, Strategy::OneShot));
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(64, Strategy::OneShot)));  // one of three buffers backs a call
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(65)));
  });
  require_no_errors(errors);
}

// CudaPlatform::allocate_multicast's plan, from the probes every rank publishes (host code: no driver call): which
// ranks share a process (handles shared directly), which run on other nodes (fabric handles needed), and that a
// multicast team has one rank per GPU. The probe says where its rank runs before anything else is probed.
TEST_CASE("mnnvl: the multicast setup plans processes and nodes from every rank's probe", "[mnnvl]") {
  const auto mine = fiar::detail::MulticastProbe::of_this_process();
  CHECK(mine.pid == static_cast<std::int64_t>(::getpid()));
  CHECK(mine.boot != 0);  // this kernel's boot id, hashed
  auto probe = [&](std::int64_t pid, std::uint64_t boot, const char* bus, int fabric) {
    fiar::detail::MulticastProbe p = mine;
    p.pid = pid;
    p.boot = boot;
    p.bytes = 1 << 20;
    p.granularity[0] = p.granularity[1] = 2 << 20;
    p.fabric = fabric;
    fiar::detail::copy_text(p.pci_bus_id, bus);
    return p;
  };
  auto plan = [](std::vector<fiar::detail::MulticastProbe> probes) {
    fiar::detail::MulticastResources owned;
    fiar::detail::MulticastSetup setup(owned, 0, static_cast<int>(probes.size()), std::chrono::seconds(1));
    setup.plan(probes);
    return std::pair{setup.uses_fabric(), setup.size()};
  };
  // One process, two GPUs: no handle leaves the process.
  CHECK(plan({probe(1, 7, "0000:01:00.0", 1), probe(1, 7, "0000:02:00.0", 1)}) ==
        std::pair{false, std::size_t{2 << 20}});
  // Two processes on one node whose ranks all have fabric handles: fabric handles through the bootstrap.
  CHECK(plan({probe(1, 7, "0000:01:00.0", 1), probe(2, 7, "0000:02:00.0", 1)}).first);
  // Two processes on one node without them: POSIX file descriptors.
  CHECK_FALSE(plan({probe(1, 7, "0000:01:00.0", 0), probe(2, 7, "0000:02:00.0", 1)}).first);
  // Two nodes (other kernels) with equal bus ids are two GPUs, and need fabric handles.
  CHECK(plan({probe(1, 7, "0000:01:00.0", 1), probe(1, 8, "0000:01:00.0", 1)}).first);
  CHECK_THROWS_WITH(plan({probe(1, 7, "0000:01:00.0", 1), probe(1, 8, "0000:01:00.0", 0)}),
                    Catch::Contains("the group spans nodes"));
  // Two ranks of one node on one GPU.
  CHECK_THROWS_WITH(plan({probe(1, 7, "0000:01:00.0", 0), probe(2, 7, "0000:01:00.0", 0)}),
                    Catch::Contains("both run on GPU 0000:01:00.0"));
}
