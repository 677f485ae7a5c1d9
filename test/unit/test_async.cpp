// SPDX-License-Identifier: Apache-2.0
// What the GPU's asynchrony shows and a synchronous emulator hides, on the host emulator in its asynchronous mode
// (HostPlatformOptions::asynchronous: launches queue on their stream, a worker per stream runs them): the calls queued
// behind a failed one drain at once on every wait (one-shot, two-shot, the multimem barrier, the NCCL route's
// announce); two ranks on one stream get an error naming it; a captured sequence replays exactly and nothing on a
// captured call's path synchronizes or allocates; check() reads the MoE index record while kernels write it; no wait
// touches host-visible memory (the emulator counts every access per memory space); a user epilogue that reads half its
// vectors leaves no slot of a slow peer unpolled; ranks whose calls differ learn it within 100 ms whatever the timeout.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

namespace {

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;
using fiar::exec::Space;
using fiar_test::at;
using Clock = std::chrono::steady_clock;

constexpr fiar::HostPlatformOptions kAsync{.blocks = 4, .lanes = 4, .cluster = 2, .asynchronous = true};
// Two lanes a rank: the drain's time is the waits', not the emulator's barriers on a loaded 2-core machine.
constexpr fiar::HostPlatformOptions kAsyncSmall{.blocks = 2, .lanes = 1, .cluster = 1, .asynchronous = true};

using fiar_test::HostWorkspace;

// run(ws) with rank `rank`'s workspace of a group of two: mnnvl for the in-switch reduction, else trtllm.
template <class F>
void with_workspace(Strategy s, fiar::InProcessBootstrap& boot, int rank, const fiar::WorkspaceConfig& cfg,
                    const fiar::HostPlatformOptions& options, F&& run) {
  if (s == Strategy::Multimem) {
    HostWorkspace<float, fiar::MnnvlPolicy> ws(boot, fiar_test::one_node(2, rank), cfg, options);
    run(ws);
  } else {
    HostWorkspace<float> ws(boot, fiar_test::one_node(2, rank), cfg, options);
    run(ws);
  }
}

// Milliseconds since `t0`.
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

// A call that times out fails the workspace (the failure word in device memory); each of the 100 calls queued behind
// it gives up within a check of its waits (kSpinsPerCheck spins), on every wait there is. Without the failure word
// (the waits ending only at their own deadline) the 100 calls would take 100 timeouts: 30 s here, hours on a GPU at
// the default timeout.
TEST_CASE("async: 100 calls queued behind a failed call drain at once, on every wait", "[async]") {
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Multimem, Strategy::Nccl);
  CAPTURE(fiar::to_string(strategy));
  constexpr int kHidden = 16, kTokens = 2, kQueued = 100;
  constexpr auto kTimeout = 300ms;
  double took_ms = 0;
  std::string error;
  auto errors = fiar_test::run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg{.max_token_num = kTokens, .hidden_dim = kHidden, .timeout = kTimeout};
    if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = std::size_t{kTokens} * kHidden * sizeof(float);
    auto run = [&](auto& ws) {
      std::vector<float> in(kTokens * kHidden, 1.0f), out(kTokens * kHidden);
      if (rank == 0) {  // rank 1 never calls: the first call times out, the rest queue behind it
        const auto t0 = Clock::now();
        try {
          for (int i = 0; i <= kQueued; ++i) ws.allreduce(in.data(), out.data(), kTokens, nullptr, strategy);
        } catch (const fiar::timeout_error&) {  // the route's calls learn the failure when they are submitted
        }
        ws.platform().synchronize();
        took_ms = ms_since(t0);
        error = fiar_test::thrown<fiar::timeout_error>([&] { ws.check(); });
      }
      boot.barrier();  // rank 1 keeps its buffers until rank 0 is done
    };
    with_workspace(strategy, boot, rank, cfg, kAsyncSmall, run);
  });
  fiar_test::require_no_errors(errors);
  CAPTURE(took_ms);
  std::printf("async drain (%s): a 300 ms timeout, then 100 queued calls: %.0f ms in all\n",
              std::string(fiar::to_string(strategy)).c_str(), took_ms);
  CHECK_THAT(error, Catch::Contains("rank 0") && Catch::Contains("gave up"));
  // One timeout, then the queue: 100 calls within 1 s.
  CHECK(took_ms < 300.0 + 1000.0 * (fiar_test::kUnderTsan ? 4 : 1));
}

// Two ranks given one stream: the second to call gets std::invalid_argument naming the stream and both ranks (the
// first one's kernel, queued on that stream, ends at its timeout: bounded, never a hang).
TEST_CASE("async: two ranks on one stream get an error naming it, not a hang", "[async]") {
  constexpr int kHidden = 16;
  const cudaStream_t shared = fiar::HostPlatform::create_stream();
  std::vector<std::string> said(2);
  const auto t0 = Clock::now();
  auto errors = fiar_test::run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, fiar_test::one_node(2, rank),
                            {.max_token_num = 1, .hidden_dim = kHidden, .timeout = 300ms}, kAsync);
    std::vector<float> in(kHidden, 1.0f), out(kHidden);
    if (rank == 1) boot.barrier();  // rank 0 claims the stream first
    said[at(rank)] = fiar_test::thrown<std::invalid_argument>(
        [&] { ws.allreduce(in.data(), out.data(), 1, shared, Strategy::OneShot); }, "(queued)");
    if (rank == 0) boot.barrier();
    ws.platform().synchronize();
    boot.barrier();
  });
  fiar::HostPlatform::destroy_stream(shared);
  fiar_test::require_no_errors(errors);
  CHECK(said[0] == "(queued)");
  CHECK_THAT(said[1], Catch::Contains("rank 1 calls on stream 0x") && Catch::Contains("which rank 0 of the same") &&
                          Catch::Contains("Fix: give each rank a stream of its own"));
  CHECK(ms_since(t0) < 10000.0);
}

// A decode step captured once (three calls of different shapes and strategies, as a CUDA graph records them) and
// replayed five times with new inputs each time: every replay gives the exact rank-order sums. During the capture the
// platform refuses to synchronize or allocate, so a call whose path did either would throw.
TEST_CASE("async: a captured sequence replays exactly, and capturing a call neither synchronizes nor allocates",
          "[async]") {
  constexpr int kHidden = 32, kWorld = 2, kReplays = 5;
  const std::vector<int> tokens = {1, 3, 2};
  const std::vector<Strategy> strategies = {Strategy::OneShot, Strategy::TwoShot, Strategy::Auto};
  auto errors = fiar_test::run_ranks(kWorld, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, fiar_test::one_node(kWorld, rank), {.max_token_num = 3, .hidden_dim = kHidden},
                            kAsync);
    const cudaStream_t stream = fiar::HostPlatform::create_stream();
    std::vector<std::vector<float>> in(tokens.size()), out(tokens.size());
    for (std::size_t c = 0; c < tokens.size(); ++c) {
      in[c].resize(static_cast<std::size_t>(tokens[c]) * kHidden);
      out[c].resize(in[c].size());
    }
    ws.platform().begin_capture(stream);
    for (std::size_t c = 0; c < tokens.size(); ++c) {
      ws.allreduce(in[c].data(), out[c].data(), tokens[c], stream, strategies[c]);
    }
    FIAR_ENSURE_THROWS_AS(ws.platform().synchronize(), std::logic_error);
    const fiar::HostGraph graph = ws.platform().end_capture();
    FIAR_ENSURE(graph.tasks.size() == tokens.size());
    for (int replay = 0; replay < kReplays; ++replay) {
      for (std::size_t c = 0; c < tokens.size(); ++c) {
        // In place: the captured calls hold these buffers' addresses.
        const auto fresh = fiar_test::make_input<float>(in[c].size(), rank, replay * 10 + static_cast<int>(c), false);
        std::copy(fresh.begin(), fresh.end(), in[c].begin());
      }
      ws.platform().replay(graph, stream);
      ws.platform().synchronize();
      ws.check();
      for (std::size_t c = 0; c < tokens.size(); ++c) {
        std::vector<std::vector<float>> all;
        for (int r = 0; r < kWorld; ++r) {
          all.push_back(fiar_test::make_input<float>(in[c].size(), r, replay * 10 + static_cast<int>(c), false));
        }
        const auto want = fiar_test::rank_order_sum(all, in[c].size());
        for (std::size_t i = 0; i < want.size(); ++i)
          FIAR_ENSURE(fiar_test::bits(out[c][i]) == fiar_test::bits(want[i]));
      }
    }
    fiar::HostPlatform::destroy_stream(stream);
  });
  fiar_test::require_no_errors(errors);
}

// check() on the host while the MoE finalize kernels that record bad indices still run: every report is one whole
// record (the fields of one call's bad entry, never a mix of two), and no record is reported twice.
TEST_CASE("async: check() reads the MoE index record while kernels write it", "[async]") {
  using T = float;
  constexpr int kWorld = 2, kTokens = 3, kHidden = 16, kTopK = 2, kCalls = 24;
  std::vector<std::string> reports;
  int rows = 0;
  auto errors = fiar_test::run_ranks(kWorld, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<T> ws(boot, fiar_test::one_node(kWorld, rank), {.max_token_num = kTokens, .hidden_dim = kHidden},
                        kAsync);
    const auto m = fiar_test::moe_inputs<T>(kTokens, kHidden, rank, fiar_test::QuantOptions::moe(kTopK, false));
    std::vector<std::vector<int>> idx(kCalls, m.idx);
    std::vector<std::vector<T>> out(kCalls, std::vector<T>(kTokens * kHidden));
    for (int c = 0; c < kCalls; ++c) {
      // Call c: entry [c % tokens][c % top_k] = rows + 1000 + c (rank 1 only).
      if (rank == 1) idx[at(c)][at((c % kTokens) * kTopK + c % kTopK)] = m.rows + 1000 + c;
    }
    std::vector<std::string> seen;
    auto poll = [&] {
      try {
        ws.check();
      } catch (const std::invalid_argument& e) {
        seen.emplace_back(e.what());
      }
    };
    for (int c = 0; c < kCalls; ++c) {
      fiar::FusedArgs<T> a{.in = m.in.data(), .num_tokens = kTokens, .out = out[at(c)].data()};
      a.expanded_idx_to_permuted_idx = idx[at(c)].data();
      a.expert_scale = m.scale.data();
      a.top_k = kTopK;
      a.num_permuted_rows = m.rows;
      ws.run<Pattern::MoeFinalizeAllReduce>(a, nullptr, c % 2 == 0 ? Strategy::OneShot : Strategy::TwoShot);
      poll();
    }
    for (int i = 0; i < 200; ++i) poll();  // racing the queue's last kernels
    ws.platform().synchronize();
    poll();
    if (rank == 1) {
      reports = seen;
      rows = m.rows;
    }
    FIAR_ENSURE(rank == 1 || seen.empty());
  });
  fiar_test::require_no_errors(errors);
  REQUIRE(!reports.empty());
  const std::regex pattern(R"(expanded_idx_to_permuted_idx\[(\d+)\]\[(\d+)\] = (\d+);)");
  std::set<int> calls;
  for (const std::string& r : reports) {
    std::smatch mt;
    REQUIRE(std::regex_search(r, mt, pattern));
    const int token = std::stoi(mt[1]), k = std::stoi(mt[2]), value = std::stoi(mt[3]);
    const int c = value - rows - 1000;
    CAPTURE(r);
    CHECK((c >= 0 && c < kCalls));
    CHECK(token == c % kTokens);
    CHECK(k == c % kTopK);
    CHECK(calls.insert(c).second);  // never the same record twice
  }
}

namespace {
// Rank 1 of the memory-space test: every lane sleeps 1 ms before each kernel, so rank 0's kernels wait for it.
void slow_start(void*, int, int) { std::this_thread::sleep_for(1ms); }
}  // namespace

// The emulator counts every kernel access per memory space. A healthy call that waits for a slow peer reaches its own
// device memory and its peers' (and the caller's tensors), never host-visible memory (on a GPU: pinned host memory,
// a PCIe round trip); a failure writes the host record once, from one lane, and the calls after it touch host memory
// no more. Reading the error record in the spin (the old give_up) fails the first check.
TEST_CASE("async: waits never touch host-visible memory; a failure writes the host record once", "[async]") {
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Multimem);
  CAPTURE(fiar::to_string(strategy));
  constexpr int kHidden = 32, kTokens = 2;
  std::vector<std::uint64_t> healthy_host(2), healthy_peer(2), healthy_device(2), failed_host(2);
  auto errors = fiar_test::run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::HostPlatformOptions o{.blocks = 4, .lanes = 4, .cluster = 2, .count_accesses = true};
    if (rank == 1) o.lane_start = slow_start;
    fiar::WorkspaceConfig cfg{.max_token_num = kTokens, .hidden_dim = kHidden, .timeout = 300ms};
    auto run = [&](auto& ws) {
      const fiar::exec::AccessCounter& n = *ws.platform().access_counts();
      std::vector<float> in(kTokens * kHidden, 1.0f), out(kTokens * kHidden);
      for (int c = 0; c < 6; ++c) ws.allreduce(in.data(), out.data(), kTokens, nullptr, strategy);
      healthy_host[at(rank)] = n[Space::HostVisible];
      healthy_peer[at(rank)] = n[Space::Peer] + n[Space::Multicast];
      healthy_device[at(rank)] = n[Space::Device];
      boot.barrier();
      if (rank == 0) {  // rank 1 makes no more calls: one timeout
        (void)fiar_test::thrown<fiar::timeout_error>(
            [&] { ws.allreduce(in.data(), out.data(), kTokens, nullptr, strategy); });
        failed_host[0] = n[Space::HostVisible] - healthy_host[0];
      }
      boot.barrier();
    };
    with_workspace(strategy, boot, rank, cfg, o, run);
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(healthy_host[at(r)] == 0);
    CHECK(healthy_peer[at(r)] > 0);
    CHECK(healthy_device[at(r)] > 0);
  }
  // The record of one timeout: the late ranks' mask, the call, the code (one lane; the claim is in device memory).
  CHECK(failed_host[0] >= 1);
  CHECK(failed_host[0] <= 4);
}

namespace {
// Reads half of each token's vectors, by the lanes that own them: vectors v with v % 8 < 4 (cluster rank 0 of the
// emulated grid below) on even calls, the others on odd ones, into out; the rest of out is left as it was.
struct HalfReader {
  static constexpr const char* name = "test_half_reader";
  template <class T>
  struct Params {
    T* out;
    int parity;
  };
  template <class T, class Token>
  FIAR_HD static void finish(const Params<T>& p, Token& token) {
    token.for_each_vec([&](int v) {
      if ((v % 8 < 4) == (p.parity == 0)) token.store(p.out, token.token(), v, token.sum(v));
    });
  }
};

// The slow peer: its lanes that push the half the other rank does not read this call sleep first (blocks of cluster
// rank 1 on even calls, 0 on odd ones: with 4 lanes a block, 2 blocks a cluster, lane l of cluster rank c pushes the
// vectors v with v % 8 == 4c + l).
struct SlowHalf {
  std::atomic<int> parity{0};
};
void slow_half(void* arg, int block, int) {
  const int parity = static_cast<SlowHalf*>(arg)->parity.load();
  if (block % 2 == (parity == 0 ? 1 : 0)) std::this_thread::sleep_for(2ms);
}
}  // namespace

// A user epilogue that leaves vectors unread must still have their slots polled: otherwise a slow peer's store for them
// lands after the next call cleared the buffer, and the call three later (same buffer) reads it as its own data.
// Without the poll after finish() this reads stale sums within a few calls; with it, every call's read half is exact.
TEST_CASE("async: a user epilogue reading half its vectors leaves no slot of a slow peer unpolled", "[async]") {
  constexpr int kHidden = 64, kTokens = 2, kCalls = 12;
  constexpr std::size_t kCount = std::size_t{kTokens} * kHidden;
  SlowHalf slow;
  std::vector<int> wrong(2, 0);
  auto errors = fiar_test::run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::HostPlatformOptions o{.blocks = 4, .lanes = 4, .cluster = 2};
    if (rank == 1) {
      o.lane_start = slow_half;
      o.lane_start_arg = &slow;
    }
    HostWorkspace<float> ws(boot, fiar_test::one_node(2, rank),
                            {.max_token_num = kTokens, .hidden_dim = kHidden, .timeout = 5s}, o);
    for (int c = 0; c < kCalls; ++c) {
      std::vector<std::vector<float>> all;
      for (int r = 0; r < 2; ++r) all.push_back(fiar_test::make_input<float>(kCount, r, c, false));
      const auto want = fiar_test::rank_order_sum(all, kCount);
      std::vector<float> out(kCount, -1.0f);
      if (rank == 1) slow.parity.store(c % 2);
      ws.run<HalfReader>(all[at(rank)].data(), kTokens, HalfReader::Params<float>{out.data(), c % 2}, nullptr,
                         Strategy::OneShot);
      for (std::size_t i = 0; i < kCount; ++i) {
        const int v = static_cast<int>(i % kHidden) / 4;  // 4 floats a vector
        if ((v % 8 < 4) == (c % 2 == 0)) wrong[at(rank)] += fiar_test::bits(out[i]) != fiar_test::bits(want[i]);
      }
    }
  });
  fiar_test::require_no_errors(errors);
  CHECK(wrong[0] == 0);
  CHECK(wrong[1] == 0);
}

// Ranks whose calls differ (num_tokens; one-shot against two-shot) with a 60 s timeout: every rank raises
// mismatch_error within 100 ms (the lane whose batch carries the peer's digest compares it as soon as it arrives, and
// the failure word ends every other wait of the rank at its next check).
TEST_CASE("async: ranks whose calls differ raise mismatch_error within 100 ms, whatever the timeout", "[async]") {
  const bool by_strategy = GENERATE(false, true);
  CAPTURE(by_strategy);
  constexpr int kHidden = 32;
  std::vector<double> took(2);
  std::vector<std::string> said(2);
  auto errors = fiar_test::run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<float> ws(boot, fiar_test::one_node(2, rank),
                            {.max_token_num = 4, .hidden_dim = kHidden, .timeout = 60s}, fiar_test::kSmallGrid);
    const int tokens = by_strategy ? 4 : 2 + 2 * rank;
    const Strategy s = by_strategy && rank == 1 ? Strategy::TwoShot : Strategy::OneShot;
    std::vector<float> in(4 * kHidden, 1.0f), out(4 * kHidden);
    boot.barrier();
    const auto t0 = Clock::now();
    said[at(rank)] =
        fiar_test::thrown<fiar::mismatch_error>([&] { ws.allreduce(in.data(), out.data(), tokens, nullptr, s); });
    took[at(rank)] = ms_since(t0);
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, took[at(r)], said[at(r)]);
    CHECK_THAT(said[at(r)], Catch::Contains("rank " + std::to_string(r)));
    CHECK(took[at(r)] < 100.0 * (fiar_test::kUnderTsan ? 10 : 1));
  }
}
