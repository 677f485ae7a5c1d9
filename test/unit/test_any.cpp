// SPDX-License-Identifier: Apache-2.0
// make_workspace / AnyWorkspace (the runtime choice every rank agrees on, the trtllm fallback of an automatic
// mnnvl choice, explicit choices never replaced), WorkspacePool's sharing rules, and the log sink — all on
// the host emulator, where multicast setup can be made to fail.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using fiar::Backend;
using fiar::Strategy;
using fiar_test::bits;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;

namespace {

constexpr fiar::HostPlatformOptions kGrid{.blocks = 2, .lanes = 4};

fiar::Topology group(int world, int rank, int nodes, bool multicast, bool fabric = false) {
  return fiar::Topology{.world_size = world,
                        .rank = rank,
                        .node_count = nodes,
                        .multicast_supported = multicast,
                        .fabric_handles_supported = fabric,
                        .arch = 90};
}

// Captures what fiar logs while alive, and restores the previous sink.
struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> warnings, debug;
  fiar::LogSink previous;
  LogCapture() {
    previous = fiar::set_log_sink([this](fiar::LogLevel level, std::string_view message) {
      std::lock_guard lock(mutex);
      if (level == fiar::LogLevel::Warning) warnings.emplace_back(message);
      if (level == fiar::LogLevel::Debug) debug.emplace_back(message);
    });
  }
  ~LogCapture() { fiar::set_log_sink(previous); }
};

// Creates the workspace on every rank with make_workspace, runs one all-reduce of 5 tokens and checks it
// bit-exactly against the rank-order reference; returns each rank's backend and fallback flag.
struct Outcome {
  Backend backend = Backend::Auto;
  Backend resolved = Backend::Auto;
  bool fell_back = false;
};
std::vector<Outcome> make_and_run(int world, Backend requested, const std::function<fiar::Topology(int)>& topo_of,
                                  const std::function<fiar::HostPlatformOptions(int)>& options_of,
                                  std::vector<std::string>& errors) {
  const int tokens = 5, hidden = 16;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<float>(count, r, 0));
  const auto want = fiar_test::rank_order_sum(inputs, count);
  std::vector<Outcome> out(static_cast<std::size_t>(world));
  std::vector<int> wrong(static_cast<std::size_t>(world), 0);
  errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    auto ws = fiar::make_workspace<float, fiar::HostPlatform>(
        boot, topo_of(rank), {.max_token_num = 8, .hidden_dim = hidden}, requested, options_of(rank));
    out[static_cast<std::size_t>(rank)] = {ws.backend(), ws.resolution().backend, ws.fell_back()};
    std::vector<float> result(count);
    ws.allreduce(inputs[static_cast<std::size_t>(rank)].data(), result.data(), tokens);
    for (std::size_t i = 0; i < count; ++i) wrong[static_cast<std::size_t>(rank)] += bits(result[i]) != bits(want[i]);
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
  return out;
}

auto same_options = [](int) { return kGrid; };

}  // namespace

TEST_CASE("make_workspace: auto picks mnnvl on one node with multicast, and it reduces", "[any]") {
  LogCapture log;
  std::vector<std::string> errors;
  const auto out = make_and_run(4, Backend::Auto, [](int r) { return group(4, r, 1, true); }, same_options, errors);
  require_no_errors(errors);
  for (const auto& o : out) {
    CHECK(o.backend == Backend::Mnnvl);
    CHECK_FALSE(o.fell_back);
  }
  CHECK(log.warnings.empty());
}

TEST_CASE("make_workspace: auto's mnnvl falls back to trtllm on one node when multicast setup fails", "[any]") {
  LogCapture log;
  std::vector<std::string> errors;
  // Only rank 2's machine fails the setup; the failure is shared, so every rank falls back together.
  const auto out = make_and_run(
      4, Backend::Auto, [](int r) { return group(4, r, 1, true); },
      [](int r) {
        auto o = kGrid;
        o.multicast = r != 2;
        return o;
      },
      errors);
  require_no_errors(errors);
  for (const auto& o : out) {
    CHECK(o.backend == Backend::Trtllm);
    CHECK(o.resolved == Backend::Mnnvl);
    CHECK(o.fell_back);
  }
  REQUIRE(log.warnings.size() == 1);  // one per group (rank 0's), none per call
  CHECK(log.warnings[0].find("rank 0: backend auto chose mnnvl") != std::string::npos);
  CHECK(log.warnings[0].find("falling back to trtllm on all 4 ranks") != std::string::npos);
  // Why the setup failed: at debug level, once.
  REQUIRE(log.debug.size() == 1);
  CHECK(log.debug[0].find("rank 2 runs on an (emulated) machine without multicast") != std::string::npos);
}

TEST_CASE("make_workspace: an explicit mnnvl is never replaced: its setup failure is the error, on every rank",
          "[any]") {
  LogCapture log;
  auto errors = run_ranks(3, [](int rank, fiar::InProcessBootstrap& boot) {
    auto options = kGrid;
    options.multicast = false;
    try {
      auto ws = fiar::make_workspace<float, fiar::HostPlatform>(
          boot, group(3, rank, 1, true), {.max_token_num = 4, .hidden_dim = 8}, Backend::Mnnvl, options);
    } catch (const fiar::multicast_error& e) {
      throw std::runtime_error(std::string("multicast_error: ") + e.what());
    }
  });
  for (const auto& e : errors) CHECK(e.rfind("multicast_error: fiar: NVLink multicast setup failed", 0) == 0);
  CHECK(log.warnings.empty());
}

TEST_CASE("make_workspace: across nodes, a failed multicast setup is an error (trtllm cannot span nodes)", "[any]") {
  LogCapture log;
  auto errors = run_ranks(4, [](int rank, fiar::InProcessBootstrap& boot) {
    auto options = kGrid;
    options.multicast = false;
    auto ws = fiar::make_workspace<float, fiar::HostPlatform>(
        boot, group(4, rank, 2, true, true), {.max_token_num = 4, .hidden_dim = 8}, Backend::Auto, options);
  });
  for (const auto& e : errors) CHECK(e.find("NVLink multicast setup failed") != std::string::npos);
  CHECK(log.warnings.empty());
}

TEST_CASE("make_workspace: multi-node topologies", "[any]") {
  std::vector<std::string> errors;
  SECTION("multicast with fabric handles across 2 nodes: mnnvl") {
    const auto out =
        make_and_run(8, Backend::Auto, [](int r) { return group(8, r, 2, true, true); }, same_options, errors);
    require_no_errors(errors);
    for (const auto& o : out) CHECK(o.backend == Backend::Mnnvl);
  }
  SECTION("no multicast across 2 nodes: nccl, which works anywhere") {
    const auto out = make_and_run(4, Backend::Auto, [](int r) { return group(4, r, 2, false); }, same_options, errors);
    require_no_errors(errors);
    for (const auto& o : out) CHECK(o.backend == Backend::Nccl);
  }
  SECTION("explicit trtllm across nodes is rejected on every rank before anything is allocated") {
    errors = run_ranks(4, [](int rank, fiar::InProcessBootstrap& boot) {
      auto ws = fiar::make_workspace<float, fiar::HostPlatform>(
          boot, group(4, rank, 2, false), {.max_token_num = 4, .hidden_dim = 8}, Backend::Trtllm, kGrid);
    });
    for (const auto& e : errors) {
      CHECK(e.find("trtllm") != std::string::npos);
      CHECK(e.find("2 nodes") != std::string::npos);
    }
  }
  SECTION("explicit nccl on one node with multicast stays nccl") {
    const auto out = make_and_run(2, Backend::Nccl, [](int r) { return group(2, r, 1, true); }, same_options, errors);
    require_no_errors(errors);
    for (const auto& o : out) CHECK(o.backend == Backend::Nccl);
  }
}

TEST_CASE("make_workspace: ranks that disagree about multicast still choose the same backend", "[any]") {
  std::vector<std::string> errors;
  SECTION("one node: rank 1 says no multicast, so nobody uses it: trtllm everywhere") {
    const auto out = make_and_run(4, Backend::Auto, [](int r) { return group(4, r, 1, r != 1); }, same_options, errors);
    require_no_errors(errors);
    for (const auto& o : out) CHECK(o.backend == Backend::Trtllm);
  }
  SECTION("two nodes: rank 3 lacks fabric handles: nccl everywhere") {
    const auto out =
        make_and_run(4, Backend::Auto, [](int r) { return group(4, r, 2, true, r != 3); }, same_options, errors);
    require_no_errors(errors);
    for (const auto& o : out) CHECK(o.backend == Backend::Nccl);
  }
}

TEST_CASE("make_workspace: ranks that request different backends all throw, naming both", "[any]") {
  auto errors = run_ranks(3, [](int rank, fiar::InProcessBootstrap& boot) {
    auto ws = fiar::make_workspace<float, fiar::HostPlatform>(boot, group(3, rank, 1, true),
                                                              {.max_token_num = 4, .hidden_dim = 8},
                                                              rank == 2 ? Backend::Trtllm : Backend::Auto, kGrid);
  });
  for (const auto& e : errors) {
    CHECK(e.find("ranks requested different backends: rank 0 asked for 'auto', rank 2 for 'trtllm'") !=
          std::string::npos);
  }
}

TEST_CASE("WorkspacePool: one workspace serves several purposes when backend, type and capacity allow", "[pool]") {
  const int world = 2;
  std::vector<std::size_t> sizes(world);
  std::vector<int> shared(world), separate(world), wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspacePool<fiar::HostPlatform> pool(boot, group(world, rank, 1, false), Backend::Auto, kGrid);
    const fiar::WorkspaceConfig big{.max_token_num = 64, .hidden_dim = 256};
    auto& plain = pool.acquire<__nv_bfloat16>("allreduce", big);
    auto& quant = pool.acquire<__nv_bfloat16>("quantized patterns", {.max_token_num = 32, .hidden_dim = 256});
    shared[static_cast<std::size_t>(rank)] =
        (&plain == &quant) && pool.size() == 1 && pool.sharing_with("quantized patterns").size() == 2;
    // Each of these needs its own workspace.
    auto& other_type = pool.acquire<float>("float", big);
    auto& other_hidden = pool.acquire<__nv_bfloat16>("draft model", {.max_token_num = 64, .hidden_dim = 512});
    auto& more_tokens = pool.acquire<__nv_bfloat16>("prefill", {.max_token_num = 65, .hidden_dim = 256});
    auto& oneshot_everywhere =
        pool.acquire<__nv_bfloat16>("oneshot", {.max_token_num = 64, .hidden_dim = 256, .oneshot_at_max_tokens = true});
    auto& other_backend = pool.acquire<__nv_bfloat16>("nccl", big, Backend::Nccl);
    // An explicit request for the backend Auto already chose shares it.
    auto& explicit_same = pool.acquire<__nv_bfloat16>("explicit trtllm", big, Backend::Trtllm);
    separate[static_cast<std::size_t>(rank)] =
        pool.size() == 6 && other_backend.backend() == Backend::Nccl && &explicit_same == &plain &&
        static_cast<void*>(&other_type) != static_cast<void*>(&plain) && &other_hidden != &plain &&
        &more_tokens != &plain && &oneshot_everywhere != &plain && &oneshot_everywhere != &more_tokens;
    // The shared workspace works for both purposes, one after the other.
    std::vector<__nv_bfloat16> x(256, fiar_test::from_float<__nv_bfloat16>(static_cast<float>(rank + 1)));
    plain.allreduce(x.data(), x.data(), 1);
    quant.allreduce(x.data(), x.data(), 1);
    for (auto v : x) wrong[static_cast<std::size_t>(rank)] += fiar_test::as_float(v) != 6.0f;  // (1+2) x 2
    sizes[static_cast<std::size_t>(rank)] = pool.size();
    pool.clear();
    sizes[static_cast<std::size_t>(rank)] += 100 * pool.size();
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(shared[static_cast<std::size_t>(r)] == 1);
    CHECK(separate[static_cast<std::size_t>(r)] == 1);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
    CHECK(sizes[static_cast<std::size_t>(r)] == 6);
  }
}

TEST_CASE("WorkspacePool: ranks asking for different workspaces all throw instead of hanging", "[pool]") {
  auto errors = run_ranks(3, [](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspacePool<fiar::HostPlatform> pool(boot, group(3, rank, 1, false), Backend::Auto, kGrid);
    pool.acquire<float>("a", {.max_token_num = rank == 1 ? 16 : 8, .hidden_dim = 32});
  });
  for (const auto& e : errors) {
    CHECK(e.find("WorkspacePool::acquire(\"a\")") != std::string::npos);
    CHECK(e.find("rank 1 {float, backend auto, max_token_num 16") != std::string::npos);
  }
}

TEST_CASE("config_can_serve: the pool's capacity rule", "[pool]") {
  const fiar::WorkspaceConfig have{.max_token_num = 64, .hidden_dim = 4096};
  CHECK(fiar::config_can_serve(have, {.max_token_num = 1, .hidden_dim = 4096}));
  CHECK(fiar::config_can_serve(have, have));
  CHECK_FALSE(fiar::config_can_serve(have, {.max_token_num = 65, .hidden_dim = 4096}));
  CHECK_FALSE(fiar::config_can_serve(have, {.max_token_num = 8, .hidden_dim = 2048}));
  CHECK_FALSE(fiar::config_can_serve(have, {.max_token_num = 8, .hidden_dim = 4096, .oneshot_at_max_tokens = true}));
  CHECK_FALSE(fiar::config_can_serve(have, {.max_token_num = 8, .hidden_dim = 4096, .oneshot_max_bytes = 4096}));
  CHECK_FALSE(
      fiar::config_can_serve(have, {.max_token_num = 8, .hidden_dim = 4096, .timeout = std::chrono::seconds(5)}));
}

TEST_CASE("log sink: replaceable, restorable, and a throwing sink does not fail the caller", "[any]") {
  std::vector<std::string> got;
  auto previous = fiar::set_log_sink([&](fiar::LogLevel, std::string_view m) { got.emplace_back(m); });
  fiar::log(fiar::LogLevel::Warning, "one");
  auto mine = fiar::set_log_sink([](fiar::LogLevel, std::string_view) { throw std::runtime_error("sink"); });
  CHECK_NOTHROW(fiar::log(fiar::LogLevel::Info, "two"));
  fiar::set_log_sink(previous);
  REQUIRE(got.size() == 1);
  CHECK(got[0] == "one");
  CHECK(mine != nullptr);
}

// A mistake of one rank alone must be raised on every rank at once, not leave the others in a collective until
// their bootstrap times out (the group's timeout here is 30 s; every rank must be done long before).
TEST_CASE("make_workspace and WorkspacePool: one rank's bad argument fails every rank at once", "[any]") {
  const int world = 4;
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 8};
  enum class Mistake { Rank, BackendValue, PoolRank, PoolBackendValue };
  const Mistake mistake = GENERATE(Mistake::Rank, Mistake::BackendValue, Mistake::PoolRank, Mistake::PoolBackendValue);
  CAPTURE(static_cast<int>(mistake));
  const bool pool = mistake == Mistake::PoolRank || mistake == Mistake::PoolBackendValue;
  const bool bad_rank = mistake == Mistake::Rank || mistake == Mistake::PoolRank;
  std::vector<std::string> kinds(world);
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::Topology topo = group(world, rank, 1, false);
    Backend requested = Backend::Auto;
    if (rank == 2) {
      if (bad_rank)
        topo.rank = 5;
      else
        requested = static_cast<Backend>(9);
    }
    try {
      if (pool) {
        fiar::WorkspacePool<fiar::HostPlatform> p(boot, topo, Backend::Auto, kGrid);
        p.acquire<float>("model", cfg, requested);
      } else {
        (void)fiar::make_workspace<float, fiar::HostPlatform>(boot, topo, cfg, requested, kGrid);
      }
    } catch (const std::invalid_argument&) {
      kinds[static_cast<std::size_t>(rank)] = "invalid_argument";
      throw;
    }
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  const std::string what = bad_rank ? "malformed topology: rank = 5" : "Backend value 9 is not a backend";
  for (int r = 0; r < world; ++r) {
    CAPTURE(r, errors[static_cast<std::size_t>(r)]);
    CHECK(kinds[static_cast<std::size_t>(r)] == "invalid_argument");
    CHECK(errors[static_cast<std::size_t>(r)].find(what) != std::string::npos);
    if (r != 2) CHECK(errors[static_cast<std::size_t>(r)].find("failed on rank 2") != std::string::npos);
  }
}

// A malformed topology is rejected by every backend's workspace before anything is sized from it (world_size 0 would
// divide by zero in the Lamport sizing).
TEST_CASE("Workspace: a malformed topology is an invalid_argument on every backend, before any sizing", "[any]") {
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 8};
  fiar::find_first(fiar::BackendPolicies{}, [&](auto p) {
    using Policy = typename decltype(p)::type;
    CAPTURE(fiar::to_string(Policy::backend));
    auto errors = run_ranks(1, [&](int, fiar::InProcessBootstrap& boot) {
      fiar::Workspace<Policy, float, fiar::HostPlatform> ws(boot, fiar::Topology{.world_size = 0}, cfg, kGrid);
    });
    CHECK(errors[0].find("malformed topology: world_size = 0") != std::string::npos);
    return false;
  });
}

TEST_CASE("why_not names a malformed topology instead of sizing buffers from it", "[any]") {
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 8};
  CHECK(fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform>::why_not(fiar::Topology{.world_size = 0}, cfg)
            .find("malformed topology: world_size = 0") != std::string::npos);
  CHECK(fiar::Workspace<fiar::MnnvlPolicy, float, fiar::HostPlatform>::why_not(
            fiar::Topology{.world_size = 0, .multicast_supported = true}, cfg)
            .find("malformed topology: world_size = 0") != std::string::npos);
}
