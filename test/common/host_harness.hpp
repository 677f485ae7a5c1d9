// SPDX-License-Identifier: Apache-2.0
// Host-emulator harness shared by the backends' tests (trtllm, mnnvl, nccl): ranks as threads, and
// all-reduce sequences checked on every rank against the rank-order reference (test code only).
#pragma once

#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference.hpp"

namespace fiar_test {

// Under ThreadSanitizer every emulated lane runs many times slower, and CI runs the whole host suite a second time
// there to check the protocols' memory ordering: the longest sweeps take fewer sizes in that build (sizes_for), the
// plain build runs every size.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif

// A timeout that the healthy ranks of a test must meet (their calls complete within it while another rank is missing
// or late): four times longer under ThreadSanitizer, where a loaded machine can hold back an emulated rank's push by
// more than a plain build's whole call.
inline std::chrono::milliseconds healthy_timeout(std::chrono::milliseconds plain) {
  return kUnderTsan ? 4 * plain : plain;
}

// `all` in the plain build, `under_tsan` (a subset of it) under ThreadSanitizer; for GENERATE(from_range(...)).
inline std::vector<int> sizes_for(std::vector<int> all, std::vector<int> under_tsan) {
  return kUnderTsan ? under_tsan : all;
}

using namespace std::chrono_literals;
using fiar::Strategy;

template <class T, class Policy = fiar::TrtllmPolicy>
using HostWorkspace = fiar::Workspace<Policy, T, fiar::HostPlatform>;

inline constexpr fiar::HostPlatformOptions kSmallGrid{.blocks = 4, .lanes = 4, .cluster = 2};

// One node with NVLink multicast (which trtllm ignores and mnnvl needs).
inline fiar::Topology one_node(int world, int rank, int arch = 90) {
  return fiar::Topology{.world_size = world, .rank = rank, .node_count = 1, .multicast_supported = true, .arch = arch};
}

// Each rank's topology, from (world, rank, arch): one_node, or a test's own (nccl: several nodes).
using TopologyOf = fiar::Topology (*)(int world, int rank, int arch);

// A rank number as an index into the per-rank vectors of a test.
inline std::size_t at(int rank) { return static_cast<std::size_t>(rank); }

// Runs body(rank, bootstrap) on one thread per rank; returns what each rank threw ("" = nothing).
inline std::vector<std::string> run_ranks(int world, const std::function<void(int, fiar::InProcessBootstrap&)>& body,
                                          std::chrono::milliseconds bootstrap_timeout = 30s) {
  fiar::InProcessGroup group(world, bootstrap_timeout);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      try {
        body(r, boot);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Checks inside a rank's thread. Catch2 2.x assertions are not thread-safe (concurrent REQUIREs corrupt its
// state: seen as "double free or corruption"), so a rank throws instead; run_ranks records what it threw and
// require_no_errors reports it on the test's own thread.
inline void ensure(bool ok, const char* expression, const char* file, int line) {
  if (!ok) throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": check failed: " + expression);
}
#define FIAR_ENSURE(...) ::fiar_test::ensure(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)
#define FIAR_ENSURE_THROWS_AS(expression, Exception) \
  ::fiar_test::ensure(                               \
      [&] {                                          \
        try {                                        \
          (void)(expression);                        \
        } catch (const Exception&) {                 \
          return true;                               \
        } catch (...) {                              \
        }                                            \
        return false;                                \
      }(),                                           \
      #expression " throws " #Exception, __FILE__, __LINE__)

inline void require_no_errors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    REQUIRE(errors[r] == "");
  }
}

// What f() threw as E, or `if_none` when it returned (anything else passes through): the ranks' threads record
// messages this way and the caller checks them, Catch2 assertions not being thread-safe.
template <class E, class F>
std::string thrown(F&& f, const std::string& if_none = "") {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return if_none;
}

// What a rank saw once a peer stopped calling: the timeout_error of its own call (and how long that call took to
// give up), then of a later call and of check(), which must repeat it ("" where nothing was thrown).
struct AfterPeerStopped {
  std::string first, later, checked;
  std::chrono::milliseconds took{};
};

// Runs call() twice and then ws.check(), recording each timeout_error.
template <class W, class F>
AfterPeerStopped after_peer_stopped(W& ws, F&& call) {
  AfterPeerStopped seen;
  const auto start = std::chrono::steady_clock::now();
  seen.first = thrown<fiar::timeout_error>(call);
  seen.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  seen.later = thrown<fiar::timeout_error>(call);
  seen.checked = thrown<fiar::timeout_error>([&] { ws.check(); });
  return seen;
}

// One call's expectations, checked on the calling rank: bit-exact against the rank-order reference, and
// within the documented bound of the exact sum.
template <class T>
struct Check {
  int mismatches = 0;
  int out_of_bound = 0;
  void compare(const std::vector<std::vector<T>>& inputs, const std::vector<T>& out, std::size_t count, int world) {
    const auto expected = fiar_test::rank_order_sum(inputs, count);
    const auto exact = fiar_test::exact_sum(inputs, count);
    for (std::size_t i = 0; i < count; ++i) {
      if (bits(out[i]) != bits(expected[i])) ++mismatches;
      double abs_sum = 0;
      for (const auto& in : inputs) abs_sum += std::fabs(static_cast<double>(fiar_test::as_float(in[i])));
      const double got = fiar_test::as_float(out[i]);
      if (std::fabs(got - exact[i]) > fiar_test::error_bound<T>(exact[i], abs_sum, world)) ++out_of_bound;
    }
  }
};

// Runs `calls` all-reduces on every rank with tokens_of(call) tokens and strategy_of(call), checking every
// rank's every result; returns the strategies rank 0 ran. Ranks run on topo_of(world, rank, 90).
template <class T, class Policy = fiar::TrtllmPolicy>
std::vector<Strategy> run_and_check(int world, fiar::WorkspaceConfig cfg, int calls,
                                    const std::function<int(int)>& tokens_of,
                                    const std::function<Strategy(int)>& strategy_of, bool in_place = false,
                                    bool specials = true, TopologyOf topo_of = one_node) {
  std::vector<Check<T>> checks(static_cast<std::size_t>(world));
  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(world));
  std::vector<Strategy> ran;
  const std::size_t max_count = static_cast<std::size_t>(cfg.max_token_num) * cfg.hidden_dim;
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostWorkspace<T, Policy> ws(boot, topo_of(world, rank, 90), cfg, kSmallGrid);
    std::vector<T> out(max_count);
    for (int call = 0; call < calls; ++call) {
      const int tokens = tokens_of(call);
      const std::size_t count = static_cast<std::size_t>(tokens) * cfg.hidden_dim;
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, call, specials));
      std::vector<T> mine = inputs[static_cast<std::size_t>(rank)];
      if (in_place) {
        ws.allreduce(mine.data(), mine.data(), tokens, nullptr, strategy_of(call));
        std::copy(mine.begin(), mine.end(), out.begin());
      } else {
        ws.allreduce(mine.data(), out.data(), tokens, nullptr, strategy_of(call));
      }
      checks[static_cast<std::size_t>(rank)].compare(inputs, out, count, world);
      if (rank == 0) ran.push_back(ws.last_strategy());
      if (call + 1 == calls) outputs[static_cast<std::size_t>(rank)].assign(out.begin(), out.begin() + count);
    }
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(checks[static_cast<std::size_t>(r)].mismatches == 0);
    CHECK(checks[static_cast<std::size_t>(r)].out_of_bound == 0);
    CHECK(outputs[static_cast<std::size_t>(r)].size() == outputs[0].size());
    CHECK(std::equal(outputs[static_cast<std::size_t>(r)].begin(), outputs[static_cast<std::size_t>(r)].end(),
                     outputs[0].begin(), [](T a, T b) { return bits(a) == bits(b); }));
  }
  return ran;
}

}  // namespace fiar_test
