// SPDX-License-Identifier: Apache-2.0
// The in-process bootstrap: all-gather in rank order, barriers, bad arguments, and bounded waits.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

// Runs f(bootstrap) on one thread per rank and collects what each rank threw (empty: nothing).
template <class F>
std::vector<std::string> run_ranks(fiar::InProcessGroup& group, F f) {
  std::vector<std::string> errors(static_cast<std::size_t>(group.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        auto boot = group.bootstrap(r);
        f(boot);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

static_assert(fiar::Bootstrap<fiar::InProcessBootstrap>);
static_assert(!fiar::Bootstrap<int>);

TEST_CASE("all_gather returns every rank's block in rank order, many rounds in a row", "[bootstrap]") {
  const int size = GENERATE(1, 2, 3, 8);
  fiar::InProcessGroup group(size, 20s);
  std::atomic<int> mismatches{0};
  auto errors = run_ranks(group, [&](fiar::InProcessBootstrap& boot) {
    for (int round = 0; round < 50; ++round) {
      const std::int64_t mine = boot.rank() * 1000 + round;
      const auto all = fiar::all_gather_value(boot, mine);
      for (int r = 0; r < size; ++r) {
        if (all[static_cast<std::size_t>(r)] != r * 1000 + round) ++mismatches;
      }
      if (round % 7 == 0) boot.barrier();
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(mismatches == 0);
}

TEST_CASE("bootstrap handles report rank and size; bad ranks and sizes are rejected", "[bootstrap]") {
  fiar::InProcessGroup group(4);
  CHECK(group.bootstrap(3).rank() == 3);
  CHECK(group.bootstrap(3).size() == 4);
  CHECK_THROWS_AS(group.bootstrap(4), std::invalid_argument);
  CHECK_THROWS_AS(group.bootstrap(-1), std::invalid_argument);
  CHECK_THROWS_AS(fiar::InProcessGroup(0), std::invalid_argument);
  CHECK_THROWS_AS(fiar::InProcessGroup(2, 0ms), std::invalid_argument);
}

TEST_CASE("all_gather with blocks of different sizes throws on every rank", "[bootstrap]") {
  fiar::InProcessGroup group(3, 20s);
  auto errors = run_ranks(group, [](fiar::InProcessBootstrap& boot) {
    std::vector<std::byte> in(static_cast<std::size_t>(boot.rank() == 1 ? 8 : 4));
    std::vector<std::byte> out(in.size() * 3);
    boot.all_gather(in, out);
  });
  for (const auto& e : errors) {
    CHECK(e.find("block sizes differ") != std::string::npos);
    CHECK(e.find("rank 1 gave 8 bytes") != std::string::npos);
  }
}

TEST_CASE("all_gather with a wrongly sized output is rejected before it waits", "[bootstrap]") {
  fiar::InProcessGroup group(2, 20s);
  auto boot = group.bootstrap(0);
  std::vector<std::byte> in(4), out(4);
  CHECK_THROWS_AS(boot.all_gather(in, out), std::invalid_argument);
}

TEST_CASE("a rank that never arrives gives timeout_error within the deadline, then the group stays broken",
          "[bootstrap]") {
  fiar::InProcessGroup group(3, 200ms);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      try {
        boot.barrier();
      } catch (const fiar::timeout_error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < 10s);
  for (const auto& e : errors) {
    CHECK(e.find("timed out after 200 ms") != std::string::npos);
    CHECK(e.find("missing rank(s): 2") != std::string::npos);
  }
  auto late = group.bootstrap(2);
  CHECK_THROWS_AS(late.barrier(), fiar::timeout_error);
}
