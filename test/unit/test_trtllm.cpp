// The trtllm backend on the host emulator: Lamport one-shot and two-shot, rotation and clearing, special
// values, in-place calls, validation, bounded waits, and collective creation.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Strategy;
using fiar::TrtllmPolicy;
using fiar_test::bits;

using fiar_test::HostWorkspace;
using fiar_test::kSmallGrid;
using fiar_test::one_node;
using fiar_test::require_no_errors;
using fiar_test::run_and_check;
using fiar_test::run_ranks;

TEMPLATE_TEST_CASE("one-shot and two-shot match the reference on every rank", "[trtllm]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(2, 4, 6, 8);
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  CAPTURE(world, fiar::to_string(strategy), fiar_test::dtype_label<TestType>());
  const fiar::WorkspaceConfig cfg{.max_token_num = 2 * world + 1, .hidden_dim = 48, .oneshot_at_max_tokens = true};
  const std::vector<int> tokens = {1, world - 1 > 0 ? world - 1 : 1, world, 2 * world + 1, 3};
  const auto ran = run_and_check<TestType>(
      world, cfg, static_cast<int>(tokens.size()), [&](int c) { return tokens[static_cast<std::size_t>(c)]; },
      [&](int) { return strategy; });
  for (Strategy s : ran) CHECK(s == strategy);
}

TEMPLATE_TEST_CASE("300 consecutive calls: rotation, clearing, strategy switches, a large call after small ones",
                   "[trtllm]", float, __nv_bfloat16) {
  const int world = 4;
  // A tiny one-shot threshold makes Auto switch between the protocols as the token count varies.
  const fiar::WorkspaceConfig cfg{.max_token_num = 24, .hidden_dim = 16, .oneshot_max_bytes = 8 * 16 * sizeof(TestType)};
  const auto ran = run_and_check<TestType>(
      world, cfg, 300, [](int c) { return c % 50 == 49 ? 24 : 1 + (c * 7) % 13; }, [](int) { return Strategy::Auto; },
      false, /*specials=*/false);
  CHECK(std::count(ran.begin(), ran.end(), Strategy::OneShot) > 50);
  CHECK(std::count(ran.begin(), ran.end(), Strategy::TwoShot) > 50);
}

TEMPLATE_TEST_CASE("in place: out may alias in", "[trtllm]", float, __half, __nv_bfloat16) {
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const fiar::WorkspaceConfig cfg{.max_token_num = 9, .hidden_dim = 32, .oneshot_at_max_tokens = true};
  run_and_check<TestType>(4, cfg, 6, [](int c) { return 4 + c; }, [&](int) { return strategy; }, /*in_place=*/true);
}

TEST_CASE("one-shot and two-shot give identical bits", "[trtllm]") {
  const int world = 6;
  const fiar::WorkspaceConfig cfg{.max_token_num = 13, .hidden_dim = 40, .oneshot_at_max_tokens = true};
  std::vector<std::vector<__nv_bfloat16>> one(world), two(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<__nv_bfloat16> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    const auto in = fiar_test::make_input<__nv_bfloat16>(13 * 40, rank, 5);
    one[static_cast<std::size_t>(rank)].resize(in.size());
    two[static_cast<std::size_t>(rank)].resize(in.size());
    ws.allreduce(in.data(), one[static_cast<std::size_t>(rank)].data(), 13, nullptr, Strategy::OneShot);
    ws.allreduce(in.data(), two[static_cast<std::size_t>(rank)].data(), 13, nullptr, Strategy::TwoShot);
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < one[0].size(); ++i) {
      REQUIRE(bits(one[static_cast<std::size_t>(r)][i]) == bits(two[static_cast<std::size_t>(r)][i]));
    }
  }
}

TEST_CASE("special values: -0, subnormals and sentinel-equal words reduce like any other value", "[trtllm]") {
  // Every input word of every rank is the sentinel pattern (fp32 -0, or the (+0, -0) bf16 pair), a negative
  // subnormal, or +0: the protocol must neither hang nor mistake them for missing data.
  const int world = 4;
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 64, .oneshot_at_max_tokens = true};
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> wf(boot, one_node(world, rank), cfg, kSmallGrid);
    std::vector<float> in(4 * 64), out(4 * 64);
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = i % 3 == 0 ? -0.0f : (i % 3 == 1 ? -std::ldexp(1.0f, -149) * static_cast<float>(rank + 1) : 0.0f);
    }
    wf.allreduce(in.data(), out.data(), 4, nullptr, strategy);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float expect = i % 3 == 1 ? -std::ldexp(1.0f, -149) * 10.0f : 0.0f;  // 1+2+3+4 subnormal steps
      if (bits(out[i]) != bits(expect)) ++wrong[static_cast<std::size_t>(rank)];
    }
    HostWorkspace<__nv_bfloat16> wb(boot, one_node(world, rank), cfg, kSmallGrid);
    std::vector<__nv_bfloat16> bin(4 * 64), bout(4 * 64);
    for (std::size_t i = 0; i < bin.size(); ++i) {
      bin[i] = fiar_test::from_bits<__nv_bfloat16>(i % 2 == 0 ? 0x0000u : 0x8000u);  // words 0x80000000
    }
    wb.allreduce(bin.data(), bout.data(), 4, nullptr, strategy);
    for (const auto& x : bout) {
      if (bits(x) != 0u) ++wrong[static_cast<std::size_t>(rank)];
    }
  });
  require_no_errors(errors);
  for (int w : wrong) CHECK(w == 0);
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
    run_and_check<float>(world, {.max_token_num = 3, .hidden_dim = 4, .oneshot_at_max_tokens = true}, 2,
                         [](int c) { return 2 + c; }, [](int c) { return c == 0 ? Strategy::OneShot : Strategy::TwoShot; });
  }
}

TEST_CASE("ranks may run different emulated grids", "[trtllm]") {
  const int world = 3;
  std::vector<std::vector<float>> outs(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(world, rank), {.max_token_num = 7, .hidden_dim = 20},
                            fiar::HostPlatformOptions{.blocks = rank + 1, .lanes = 2 + rank});
    std::vector<float> in(7 * 20, static_cast<float>(rank + 1)), out(7 * 20);
    ws.allreduce(in.data(), out.data(), 7, nullptr, Strategy::TwoShot);
    ws.allreduce(in.data(), out.data(), 7, nullptr, Strategy::OneShot);
    outs[static_cast<std::size_t>(rank)] = out;
  });
  require_no_errors(errors);
  for (const auto& o : outs) CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 6.0f; }));
}

TEST_CASE("a rank that never arrives: the others get timeout_error within the deadline, then stay failed",
          "[trtllm]") {
  const int world = 4;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  std::vector<fiar_test::AfterPeerStopped> seen(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(world, rank), {.max_token_num = 4, .hidden_dim = 16, .timeout = 300ms},
                            kSmallGrid);
    if (rank == 3) return;  // never calls
    std::vector<float> in(64, 1.0f), out(64);
    seen[static_cast<std::size_t>(rank)] =
        fiar_test::after_peer_stopped(ws, [&] { ws.allreduce(in.data(), out.data(), 4, nullptr, strategy); });
  });
  require_no_errors(errors);
  for (int r = 0; r < 3; ++r) {
    const auto& s = seen[static_cast<std::size_t>(r)];
    CAPTURE(r, s.first);
    CHECK(s.first.find("gave up after 300 ms waiting for data from rank(s) 3 (call 0)") != std::string::npos);
    CHECK(s.later == s.first);
    CHECK(s.checked == s.first);
    CHECK(s.took < 20s);
  }
}

TEST_CASE("bad calls are rejected before anything is launched, naming the value and the limit", "[trtllm]") {
  const int world = 2;
  const fiar::WorkspaceConfig cfg{.max_token_num = 8, .hidden_dim = 16};
  std::vector<std::vector<std::string>> messages(world);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(world, rank), cfg, kSmallGrid);
    alignas(16) static thread_local float in[8 * 16 + 4], out[8 * 16 + 4];
    auto& msgs = messages[static_cast<std::size_t>(rank)];
    auto expect_reject = [&](auto&& f) { msgs.push_back(fiar_test::thrown<std::invalid_argument>(f, "(accepted)")); };
    expect_reject([&] { ws.allreduce(nullptr, out, 1); });
    expect_reject([&] { ws.allreduce(in, nullptr, 1); });
    expect_reject([&] { ws.allreduce(in, out, 0); });
    expect_reject([&] { ws.allreduce(in, out, 9); });
    expect_reject([&] { ws.allreduce(in + 1, out, 1); });
    expect_reject([&] { ws.allreduce(in, out + 2, 1); });
    expect_reject([&] { ws.allreduce(in, in + 4, 1); });                       // out overlaps in by 48 bytes
    expect_reject([&] { ws.allreduce(in, out, 8, nullptr, Strategy::OneShot); });  // beyond one-shot capacity?
    // Nothing was launched: the protocol state is intact and a real call still reduces correctly.
    std::fill(in, in + 8 * 16, static_cast<float>(rank + 1));
    ws.allreduce(in, out, 8);
    wrong[static_cast<std::size_t>(rank)] = static_cast<int>(std::count_if(out, out + 8 * 16, [](float x) { return x != 3.0f; }));
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    const auto& m = messages[static_cast<std::size_t>(r)];
    REQUIRE(m.size() == 8);
    CHECK(m[0].find("in is a null pointer") != std::string::npos);
    CHECK(m[1].find("out is a null pointer") != std::string::npos);
    CHECK(m[2].find("num_tokens = 0; allowed: 1 to max_token_num = 8") != std::string::npos);
    CHECK(m[3].find("num_tokens = 9; allowed: 1 to max_token_num = 8") != std::string::npos);
    CHECK(m[4].find("in = 0x") != std::string::npos);
    CHECK(m[4].find("not 16-byte aligned") != std::string::npos);
    CHECK(m[5].find("out = 0x") != std::string::npos);
    CHECK(m[6].find("out (0x") != std::string::npos);
    CHECK(m[6].find("64 bytes) overlaps in (") != std::string::npos);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
  // With world 2 the default threshold (32 MiB) covers 8 tokens, so a forced one-shot fits: accepted.
  CHECK(messages[0][7] == "(accepted)");
}

TEST_CASE("a forced strategy beyond the buffer's capacity is rejected with the sizes", "[trtllm]") {
  // A one-shot threshold of 2 tokens sizes the buffers for two-shot at 32 tokens: (4 x 8 + 32) rows of
  // 64 bytes = 4096 bytes, which holds one-shot (4 rows per token) up to 16 tokens.
  const fiar::WorkspaceConfig cfg{.max_token_num = 32, .hidden_dim = 16, .oneshot_max_bytes = 2 * 16 * 4};
  std::vector<std::string> msg(4);
  std::vector<int> sufficient(4);
  auto errors = run_ranks(4, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(4, rank), cfg, kSmallGrid);
    sufficient[static_cast<std::size_t>(rank)] =
        ws.is_buffer_size_sufficient(16, Strategy::OneShot) * 1 + ws.is_buffer_size_sufficient(17, Strategy::OneShot) * 2 +
        ws.is_buffer_size_sufficient(32, Strategy::TwoShot) * 4 + ws.is_buffer_size_sufficient(32) * 8 +
        ws.is_buffer_size_sufficient(33) * 16 + ws.is_buffer_size_sufficient(0) * 32;
    std::vector<float> in(32 * 16), out(32 * 16);
    try {
      ws.allreduce(in.data(), out.data(), 32, nullptr, Strategy::OneShot);
    } catch (const std::invalid_argument& e) {
      msg[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  require_no_errors(errors);
  for (int r = 0; r < 4; ++r) {
    CHECK(sufficient[static_cast<std::size_t>(r)] == 1 + 4 + 8);
    CHECK(msg[static_cast<std::size_t>(r)].find(
              "oneshot with num_tokens = 32 needs 8192 bytes per Lamport buffer; this workspace has 4096") !=
          std::string::npos);
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
  SECTION("a topology that does not match the bootstrap") {
    auto errors = run_ranks(2, [](int rank, fiar::InProcessBootstrap& boot) {
      HostWorkspace<float> ws(boot, one_node(4, rank), {.max_token_num = 1, .hidden_dim = 4});
    });
    CHECK(errors[0].find("the topology says world_size 4, rank 0, but the bootstrap says size 2") != std::string::npos);
    CHECK(errors[1].find("rank 0 rejected it") != std::string::npos);
  }
}

TEST_CASE("creation: bad configurations are rejected on every rank", "[trtllm]") {
  const auto [cfg, expected] = GENERATE(table<fiar::WorkspaceConfig, std::string>({
      {fiar::WorkspaceConfig{.max_token_num = 0, .hidden_dim = 16}, "max_token_num = 0; allowed: 1 or more"},
      {fiar::WorkspaceConfig{.max_token_num = 4, .hidden_dim = 6}, "hidden_dim = 6 for half; allowed: a positive multiple of 8"},
      {fiar::WorkspaceConfig{.max_token_num = 4, .hidden_dim = 16, .timeout = 0ms}, "timeout = 0 ms; allowed: 1 ms to 24 h"},
      {fiar::WorkspaceConfig{.max_token_num = 1 << 30, .hidden_dim = 8192}, "allowed: at most 16 GiB"},
  }));
  auto errors = run_ranks(3, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<__half> ws(boot, one_node(3, rank), cfg);
  });
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find(expected) != std::string::npos);
  }
}

TEST_CASE("creation: ranks with different configurations all throw, naming both", "[trtllm]") {
  auto errors = run_ranks(3, [](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(3, rank), {.max_token_num = rank == 2 ? 16 : 8, .hidden_dim = 32});
  });
  for (const auto& e : errors) {
    CHECK(e.find("configurations differ between ranks") != std::string::npos);
    CHECK(e.find("rank 2 has {backend trtllm, dtype float, world_size 3, max_token_num 16") != std::string::npos);
  }
  auto one_bad = run_ranks(3, [](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, one_node(3, rank), {.max_token_num = 8, .hidden_dim = rank == 1 ? 30 : 32});
  });
  CHECK(one_bad[1].find("hidden_dim = 30 for float") != std::string::npos);
  CHECK(one_bad[0].find("rank 1 rejected it: WorkspaceConfig::hidden_dim = 30") != std::string::npos);
}

TEST_CASE("creation: a bad emulator grid on one rank makes every rank throw, none waits", "[trtllm]") {
  auto errors = run_ranks(
      3,
      [](int rank, fiar::InProcessBootstrap& boot) {
        HostWorkspace<float> ws(boot, one_node(3, rank), {.max_token_num = 2, .hidden_dim = 4},
                                fiar::HostPlatformOptions{.blocks = rank == 1 ? 0 : 2, .lanes = 4});
      },
      20s);
  CHECK(errors[1].find("host emulator grid of 0 blocks x 4 lanes") != std::string::npos);
  CHECK(errors[0].find("HostPlatform setup failed on rank 1: host emulator grid of 0 blocks") != std::string::npos);
  CHECK(errors[2].find("HostPlatform setup failed on rank 1") != std::string::npos);
}

TEST_CASE("strategy table and capacity", "[trtllm]") {
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(90, 8) == 512 * 1024);
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(100, 8) == 1024 * 1024);
  STATIC_REQUIRE(fiar::default_oneshot_max_bytes(90, 2) == 32 * 1024 * 1024);
  STATIC_REQUIRE(fiar::choose_strategy(8, 4, 1 << 30, 0) == Strategy::OneShot);   // fewer tokens than ranks
  STATIC_REQUIRE(fiar::choose_strategy(1, 100, 1 << 30, 0) == Strategy::OneShot);  // a single rank
  STATIC_REQUIRE(fiar::choose_strategy(8, 64, 1024, 1024) == Strategy::OneShot);
  STATIC_REQUIRE(fiar::choose_strategy(8, 64, 1025, 1024) == Strategy::TwoShot);
  // required_bytes: three buffers of max(one-shot at the threshold, two-shot at max_token_num).
  const fiar::WorkspaceConfig cfg{.max_token_num = 64, .hidden_dim = 7168};
  const fiar::Topology t8 = one_node(8, 0, 90);
  const std::size_t row = 7168 * 2;
  const std::size_t oneshot_tokens = std::min<std::size_t>(512 * 1024 / row, 64);  // 36
  const std::size_t expect = 3 * std::max(8 * oneshot_tokens * row, (8 * 8 + 64) * row);
  CHECK(HostWorkspace<__nv_bfloat16>::required_bytes(t8, cfg) == expect);
  CHECK(HostWorkspace<__nv_bfloat16>::can_implement(t8, cfg));
  CHECK_FALSE(HostWorkspace<__nv_bfloat16>::can_implement(fiar::Topology{.world_size = 8, .node_count = 2}, cfg));
  CHECK(HostWorkspace<__nv_bfloat16>::why_not(t8, {.max_token_num = 64, .hidden_dim = 7}).find("hidden_dim = 7") !=
        std::string::npos);
}

TEST_CASE("a moved workspace keeps working; the moved-from one refuses calls", "[trtllm]") {
  auto errors = run_ranks(2, [](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> a(boot, one_node(2, rank), {.max_token_num = 2, .hidden_dim = 4}, kSmallGrid);
    std::vector<float> in(8, 1.0f), out(8);
    a.allreduce(in.data(), out.data(), 2);
    HostWorkspace<float> b(std::move(a));
    b.allreduce(in.data(), out.data(), 2);
    FIAR_ENSURE(out[7] == 2.0f);
    FIAR_ENSURE_THROWS_AS(a.check(), std::logic_error);
  });
  require_no_errors(errors);
}
