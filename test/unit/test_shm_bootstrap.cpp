// SPDX-License-Identifier: Apache-2.0
// The shared-memory bootstrap of the multi-process GPU test (test/common/shm_bootstrap.hpp), on the host:
// ranks are fork()ed processes (no CUDA here), each reporting through its exit code.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../common/shm_bootstrap.hpp"
#include "../common/text.hpp"

using namespace std::chrono_literals;
using fiar_test::ShmBootstrap;
using fiar_test::ShmSegment;

namespace {

// Forks one process per entry of `ranks`; child i runs body(ranks[i]) and exits with its result (an
// exception: 99, after printing it). Returns the children's wait statuses, in the order of `ranks`.
std::vector<int> run_processes(const std::vector<int>& ranks, const std::function<int(int)>& body,
                               std::chrono::milliseconds limit = 60s) {
  std::fflush(nullptr);  // nothing buffered may be written twice
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 99;
      try {
        code = body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    REQUIRE(pid > 0);
    pids.push_back(pid);
  }
  return fiar_test::wait_children(pids, limit);
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

void require_all_exit_zero(const std::vector<int>& status) {
  for (std::size_t i = 0; i < status.size(); ++i) {
    CAPTURE(i, fiar_test::describe_wait_status(status[i]));
    CHECK(exit_code(status[i]) == 0);
  }
}

using fiar_test::contains;

}  // namespace

static_assert(fiar::Bootstrap<ShmBootstrap>);

TEST_CASE("shm bootstrap: all_gather across processes returns every rank's block in rank order", "[shm]") {
  const int world = GENERATE(1, 3);
  ShmSegment segment(fiar_test::unique_shm_name("unit"), world);
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(r);
  const auto status = run_processes(ranks, [&](int rank) {
    ShmBootstrap boot(segment.name(), rank, world, 20s);
    if (boot.rank() != rank || boot.size() != world) return 1;
    for (int round = 0; round < 50; ++round) {
      // Block sizes change from round to round (the same on every rank), so stale slot contents show.
      const std::size_t n = 1 + static_cast<std::size_t>(round % 5) * 37;
      std::vector<std::uint32_t> mine(n), all(n * static_cast<std::size_t>(world));
      for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::uint32_t>(rank * 1000000 + round * 1000 + i);
      boot.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          if (all[static_cast<std::size_t>(r) * n + i] != static_cast<std::uint32_t>(r * 1000000 + round * 1000 + i))
            return 2;
        }
      }
      if (round % 3 == 0) boot.barrier();
      if (fiar::all_gather_value(boot, round * 10 + rank) != [&] {
            std::vector<int> want;
            for (int r = 0; r < world; ++r) want.push_back(round * 10 + r);
            return want;
          }())
        return 3;
    }
    return 0;
  });
  require_all_exit_zero(status);
}

TEST_CASE("shm bootstrap: bad blocks throw on every rank and leave the group usable", "[shm]") {
  constexpr int world = 3;
  ShmSegment segment(fiar_test::unique_shm_name("unit"), world);
  const auto status = run_processes({0, 1, 2}, [&](int rank) {
    ShmBootstrap boot(segment.name(), rank, world, 20s);
    auto gather = [&](std::size_t bytes) {
      std::vector<std::byte> in(bytes, std::byte{static_cast<unsigned char>(rank + 1)});
      std::vector<std::byte> out(bytes * world);
      boot.all_gather(in, out);
      for (int r = 0; r < world; ++r) {
        if (bytes > 0 && out[static_cast<std::size_t>(r) * bytes] != std::byte{static_cast<unsigned char>(r + 1)})
          return false;
      }
      return true;
    };
    if (!gather(fiar_test::kShmMaxBlock)) return 1;  // the largest block works
    try {
      (void)gather(rank == 1 ? fiar_test::kShmMaxBlock + 1 : 8);  // rank 1 too large
      return 2;
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "rank 1 passed 4097 bytes; allowed: at most 4096")) return 3;
    }
    try {
      (void)gather(rank == 2 ? 16 : 8);  // sizes differ
      return 4;
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "block sizes differ")) return 5;
    }
    std::vector<std::byte> in(8), wrong_out(8);
    try {
      boot.all_gather(in, wrong_out);  // rejected before waiting: no collective happened
      return 6;
    } catch (const std::invalid_argument&) {
    }
    if (!gather(0) || !gather(24)) return 7;  // still usable
    boot.barrier();
    return 0;
  });
  require_all_exit_zero(status);
}

TEST_CASE("shm bootstrap: a rank that never arrives gives timeout_error within the bound, naming it", "[shm]") {
  constexpr int world = 3;
  ShmSegment segment(fiar_test::unique_shm_name("unit"), world);
  const auto start = std::chrono::steady_clock::now();
  // Ranks 0 and 1 run; rank 2 never starts. The first rank to time out names rank 2 and breaks the
  // group; the other either times out itself (also naming rank 2) or sees the broken group.
  const auto status = run_processes({0, 1}, [&](int rank) {
    ShmBootstrap boot(segment.name(), rank, world, 300ms);
    try {
      boot.barrier();
      return 1;
    } catch (const fiar::timeout_error& e) {
      const std::string what = e.what();
      const auto missing = what.find("missing rank(s): ");  // "2", or "1, 2" if rank 1 started late
      if (contains(what, "timed out after 300 ms") && missing != std::string::npos &&
          contains(what.substr(missing), "2")) {
        return 20;
      }
      if (contains(e.what(), "the group is broken")) return 21;
      std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, e.what());
      return 2;
    }
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < 10s);
  int named = 0;
  for (std::size_t i = 0; i < status.size(); ++i) {
    CAPTURE(i, fiar_test::describe_wait_status(status[i]));
    const int code = exit_code(status[i]);
    CHECK((code == 20 || code == 21));
    named += code == 20 ? 1 : 0;
  }
  CHECK(named >= 1);
  // Rank 2 arriving late finds the group broken and fails at once.
  ShmBootstrap late(segment.name(), 2, world, 60s);
  const auto late_start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(late.barrier(), fiar::timeout_error);
  CHECK(std::chrono::steady_clock::now() - late_start < 5s);
}

TEST_CASE("shm bootstrap: abandon() releases a peer's wait at once", "[shm]") {
  constexpr int world = 2;
  ShmSegment segment(fiar_test::unique_shm_name("unit"), world);
  const auto start = std::chrono::steady_clock::now();
  const auto status = run_processes({0, 1}, [&](int rank) {
    ShmBootstrap boot(segment.name(), rank, world, 60s);
    if (rank == 1) {
      std::this_thread::sleep_for(100ms);
      boot.abandon();
      return 0;
    }
    try {
      boot.barrier();
      return 1;
    } catch (const fiar::timeout_error& e) {
      return contains(e.what(), "rank 1 gave up") ? 0 : 2;
    }
  });
  require_all_exit_zero(status);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("shm bootstrap: bad arguments and segments are rejected; the segment is unlinked", "[shm]") {
  std::string name;
  {
    ShmSegment segment(fiar_test::unique_shm_name("unit"), 2);
    name = segment.name();
    CHECK_THROWS_AS(ShmBootstrap(name, 2, 2), std::invalid_argument);
    CHECK_THROWS_AS(ShmBootstrap(name, -1, 2), std::invalid_argument);
    CHECK_THROWS_AS(ShmBootstrap(name, 0, 3), std::invalid_argument);  // the segment says world 2
    CHECK_THROWS_AS(ShmBootstrap(name, 0, 2, 0ms), std::invalid_argument);
    CHECK_THROWS_AS(ShmSegment(name, 2), std::runtime_error);  // exists already
    ShmBootstrap solo(name, 0, 2);
    CHECK(solo.rank() == 0);
    CHECK(solo.size() == 2);
  }
  CHECK_THROWS_AS(ShmBootstrap(name, 0, 2), std::runtime_error);  // unlinked
  CHECK_THROWS_AS(ShmSegment(fiar_test::unique_shm_name("unit"), 0), std::invalid_argument);
  CHECK_THROWS_AS(ShmSegment(fiar_test::unique_shm_name("unit"), fiar_test::kShmMaxRanks + 1), std::invalid_argument);
}

// FIAR_ALLREDUCE_BACKEND is per process: one process with a bad value must fail make_workspace and WorkspacePool on
// every rank at once (the variable is read inside the collective agreement), instead of throwing alone while its
// peers wait for it until their bootstrap times out (20 s here).
TEST_CASE("a bad FIAR_ALLREDUCE_BACKEND in one process fails every process at once", "[shm]") {
  const bool pool = GENERATE(false, true);
  CAPTURE(pool);
  const int world = 2;
  ShmSegment segment(fiar_test::unique_shm_name("env"), world);
  const auto start = std::chrono::steady_clock::now();
  const auto status = run_processes({0, 1}, [&](int rank) {
    if (rank == 1)
      ::setenv(fiar::backend_env_var, "nvls", 1);
    else
      ::unsetenv(fiar::backend_env_var);
    ShmBootstrap boot(segment.name(), rank, world, 20s);
    const fiar::Topology topo{.world_size = world, .rank = rank, .arch = 90};
    const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 8};
    try {
      if (pool) {
        fiar::WorkspacePool<fiar::HostPlatform> p(boot, topo);
        p.acquire<float>("model", cfg);
      } else {
        (void)fiar::make_workspace<float, fiar::HostPlatform>(boot, topo, cfg);
      }
      return 1;
    } catch (const std::invalid_argument& e) {
      const std::string want = rank == 1 ? "FIAR_ALLREDUCE_BACKEND='nvls' is not an all-reduce backend"
                                         : "failed on rank 1: FIAR_ALLREDUCE_BACKEND='nvls'";
      if (!contains(e.what(), want)) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        return 2;
      }
      return 0;
    }
  });
  require_all_exit_zero(status);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}
