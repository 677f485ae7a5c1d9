// SPDX-License-Identifier: Apache-2.0
// The TCP bootstrap with its ranks as threads (the process cases are test/tools/check_processes.py): all-gather in
// rank order, disagreements, bounded waits, the launchers' environment variables, and the host emulator on top of it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../common/text.hpp"

using namespace std::chrono_literals;

namespace {

// A port nobody listens on right now (the kernel's choice for port 0).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t n = sizeof(a);
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) == 0);
  ::close(s);
  return ntohs(a.sin_port);
}

fiar::TcpBootstrapOptions options(int rank, int world, int port, std::chrono::milliseconds timeout = 20s) {
  fiar::TcpBootstrapOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout = timeout;
  return o;
}

// Runs body(rank) on one thread per entry of `ranks` and returns what each threw ("" for nothing).
std::vector<std::string> run_threads(const std::vector<int>& ranks, const std::function<void(int)>& body) {
  std::vector<std::string> errors(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        body(ranks[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

using fiar_test::contains;

// A raw connection to host:port, retried until something listens there or `within` passes (-1: none).
int connect_raw(const char* host, int port, std::chrono::milliseconds within = 5s) {
  const auto until = std::chrono::steady_clock::now() + within;
  do {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, host, &a.sin_addr);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(10ms);
  } while (std::chrono::steady_clock::now() < until);
  return -1;
}

// This process's resident memory, in KiB.
long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// Sets environment variables for one scope and restores them.
class LauncherEnv {
 public:
  LauncherEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kAll) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
  }
  ~LauncherEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }

 private:
  static constexpr const char* kAll[] = {"FIAR_RANK",
                                         "FIAR_WORLD_SIZE",
                                         "FIAR_LOCAL_RANK",
                                         "FIAR_LOCAL_WORLD_SIZE",
                                         "FIAR_MASTER_ADDR",
                                         "FIAR_MASTER_PORT",
                                         "FIAR_BOOTSTRAP_TOKEN",
                                         "FIAR_LISTEN_ALL",
                                         "RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "MPI_LOCALRANKID",
                                         "MPI_LOCALNRANKS",
                                         "SLURM_PROCID",
                                         "SLURM_NTASKS",
                                         "SLURM_LOCALID",
                                         "SLURM_NTASKS_PER_NODE"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

}  // namespace

static_assert(fiar::Bootstrap<fiar::TcpBootstrap>);

TEST_CASE("tcp: all_gather returns every rank's block in rank order, sizes changing from round to round", "[tcp]") {
  const int world = GENERATE(1, 2, 5);
  const int port = free_port();
  std::atomic<int> wrong{0};
  const auto errors = run_threads({0, 1, 2, 3, 4, 5, 6, 7}, [&](int rank) {
    if (rank >= world) return;
    fiar::TcpBootstrap boot(options(rank, world, port));
    if (boot.rank() != rank || boot.size() != world) ++wrong;
    for (int round = 0; round < 40; ++round) {
      const std::size_t n = static_cast<std::size_t>(round % 4) * 300;  // 0 bytes too (a barrier)
      std::vector<std::uint32_t> mine(n), all(n * static_cast<std::size_t>(world));
      for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::uint32_t>(rank * 1000000 + round * 1000 + i);
      boot.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          if (all[static_cast<std::size_t>(r) * n + i] != static_cast<std::uint32_t>(r * 1000000 + round * 1000 + i))
            ++wrong;
        }
      }
      if (round % 5 == 0) boot.barrier();
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(wrong == 0);
}

TEST_CASE("tcp: blocks of different sizes throw std::invalid_argument on every rank, then the group is broken",
          "[tcp]") {
  const int port = free_port();
  std::atomic<int> invalid{0}, broken_after{0};
  const auto errors = run_threads({0, 1, 2}, [&](int rank) {
    fiar::TcpBootstrap boot(options(rank, 3, port));
    std::vector<std::byte> in(rank == 1 ? 8 : 4), out(in.size() * 3);
    try {
      boot.all_gather(in, out);
    } catch (const std::invalid_argument& e) {
      if (contains(e.what(), "block sizes differ") && contains(e.what(), "rank 1 gave 8 bytes")) ++invalid;
    }
    try {
      boot.barrier();
    } catch (const fiar::timeout_error&) {
      ++broken_after;
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(invalid == 3);
  CHECK(broken_after == 3);
}

TEST_CASE("tcp: a rank that never arrives gives timeout_error on every other rank within the timeout", "[tcp]") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  // Rank 2 of 4 never starts.
  const auto errors =
      run_threads({0, 1, 3}, [&](int rank) { fiar::TcpBootstrap boot(options(rank, 4, port, 1500ms)); });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 1500ms + 3s);
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "missing rank(s): 2"));
  }
}

TEST_CASE("tcp: a rank that stops calling collectives times out its peers, and a peer that leaves is named", "[tcp]") {
  const int port = free_port();
  std::vector<std::string> later(3);
  const auto errors = run_threads({0, 1, 2}, [&](int rank) {
    auto boot = std::make_unique<fiar::TcpBootstrap>(options(rank, 3, port, 1000ms));
    boot->barrier();
    if (rank == 2) {
      boot.reset();  // rank 2 leaves: its connection closes
      return;
    }
    try {
      boot->barrier();
    } catch (const fiar::timeout_error& e) {
      later[static_cast<std::size_t>(rank)] = e.what();
    }
    try {
      boot->barrier();  // broken: throws at once
    } catch (const fiar::timeout_error& e) {
      later[static_cast<std::size_t>(rank)] += std::string(" | then: ") + e.what();
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  for (int r : {0, 1}) {
    CAPTURE(later[static_cast<std::size_t>(r)]);
    CHECK(contains(later[static_cast<std::size_t>(r)], "rank 2 left the group"));
    CHECK(contains(later[static_cast<std::size_t>(r)], " | then: "));
  }
}

TEST_CASE("tcp: ranks that disagree on the world size, or claim one rank twice, are rejected on every rank", "[tcp]") {
  SECTION("world size") {
    const int port = free_port();
    const auto errors =
        run_threads({0, 1}, [&](int rank) { fiar::TcpBootstrap boot(options(rank, rank == 0 ? 2 : 3, port, 5s)); });
    for (const auto& e : errors) {
      CAPTURE(e);
      CHECK(contains(e, "rank 1 was started with world size 3, rank 0 with 2"));
    }
  }
  SECTION("the same rank twice") {
    const int port = free_port();
    std::atomic<int> invalid{0};
    const auto errors = run_threads({0, 1, 1}, [&](int rank) {
      try {
        fiar::TcpBootstrap boot(options(rank, 3, port, 5s));
      } catch (const std::invalid_argument& e) {
        if (contains(e.what(), "two processes claim rank 1")) ++invalid;
      }
    });
    for (const auto& e : errors) CHECK(e.empty());
    CHECK(invalid == 3);
  }
}

TEST_CASE("tcp: bad options name the value and the fix", "[tcp]") {
  CHECK_THROWS_WITH(fiar::TcpBootstrap(options(3, 3, 1234)), Catch::Contains("rank = 3; allowed: 0 to 2"));
  CHECK_THROWS_WITH(fiar::TcpBootstrap(options(0, 0, 1234)), Catch::Contains("world_size = 0"));
  CHECK_THROWS_WITH(fiar::TcpBootstrap(options(0, 2, 70000)), Catch::Contains("master_port = 70000"));
  CHECK_THROWS_WITH(fiar::TcpBootstrap(options(0, 2, 1234, 0ms)), Catch::Contains("timeout = 0 ms"));
  auto bad_host = options(1, 2, 1234, 2s);
  bad_host.master_addr = "no-such-host.invalid";
  CHECK_THROWS_AS(fiar::TcpBootstrap(bad_host), std::invalid_argument);
  // Nobody listens: bounded by the timeout.
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(fiar::TcpBootstrap(options(1, 2, free_port(), 500ms)), Catch::Contains("could not reach rank 0"));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("tcp: the launchers' variables, in order of precedence", "[tcp]") {
  {
    LauncherEnv env(
        {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29400"}});
    const auto e = fiar::launch_environment();
    CHECK(e.rank == 3);
    CHECK(e.world_size == 8);
    CHECK(e.local_rank == 1);
    CHECK(e.master_addr == "node7");
    CHECK(e.master_port == 29401);  // torchrun's store holds MASTER_PORT itself
    CHECK(e.source == "torchrun");
  }
  {
    LauncherEnv env({{"OMPI_COMM_WORLD_RANK", "5"},
                     {"OMPI_COMM_WORLD_SIZE", "16"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "5"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                     {"FIAR_MASTER_ADDR", "head"}});
    const auto e = fiar::launch_environment();
    CHECK(e.rank == 5);
    CHECK(e.world_size == 16);
    CHECK(e.local_rank == 5);
    CHECK(e.local_world_size == 8);
    CHECK(e.source == "Open MPI");
    const auto o = fiar::TcpBootstrapOptions::from_environment();
    CHECK(o.master_addr == "head");
    CHECK(o.master_port == 29600);  // the default
  }
  {
    // fiar's own variables win over the launcher's.
    LauncherEnv env({{"FIAR_RANK", "1"},
                     {"FIAR_WORLD_SIZE", "2"},
                     {"RANK", "7"},
                     {"WORLD_SIZE", "9"},
                     {"SLURM_PROCID", "4"},
                     {"FIAR_MASTER_PORT", "1111"},
                     {"MASTER_PORT", "2222"}});
    const auto e = fiar::launch_environment();
    CHECK(e.rank == 1);
    CHECK(e.world_size == 2);
    CHECK(e.master_port == 1111);
    CHECK(e.source == "FIAR_RANK");
  }
  {
    LauncherEnv env({{"FIAR_RANK", "one"}});
    CHECK_THROWS_WITH(fiar::launch_environment(), Catch::Contains("FIAR_RANK = 'one'"));
  }
  {
    LauncherEnv env({});
    CHECK(fiar::launch_environment().rank == -1);
    CHECK_THROWS_WITH(fiar::TcpBootstrapOptions::from_environment(), Catch::Contains("FIAR_RANK and FIAR_WORLD_SIZE"));
  }
}

TEST_CASE("tcp: a trtllm workspace on the host emulator over the TCP bootstrap (ranks as threads)", "[tcp]") {
  const int port = free_port();
  constexpr int kWorld = 3, kHidden = 64, kTokens = 2;
  std::atomic<int> wrong{0};
  const auto errors = run_threads({0, 1, 2}, [&](int rank) {
    fiar::TcpBootstrap boot(options(rank, kWorld, port));
    fiar::Topology topo;
    topo.world_size = kWorld;
    topo.rank = rank;
    topo.arch = 90;
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = kTokens;
    cfg.hidden_dim = kHidden;
    fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform> ws(
        boot, topo, cfg, fiar::HostPlatformOptions{.blocks = 2, .lanes = 4, .cluster = 1});
    std::vector<float> in(kTokens * kHidden), out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
    ws.allreduce(in.data(), out.data(), kTokens);
    ws.check();
    // 1 + 2 + 3 = 6 times each value: small integers, exact in float.
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i] != 6.0f * static_cast<float>(i % 7)) ++wrong;
    }
    CHECK(!ws.platform().across_processes());
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(wrong == 0);
}

TEST_CASE("tcp: SHA-256 and HMAC-SHA-256 give the standards' test vectors", "[tcp]") {
  auto hex = [](const fiar::detail::Digest256& d) {
    std::string out;
    char buf[3];
    for (std::byte b : d) {
      std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned>(b));
      out += buf;
    }
    return out;
  };
  auto bytes = [](const std::string& text) { return std::as_bytes(std::span(text.data(), text.size())); };
  // FIPS 180-2, appendix B.1 and B.2.
  CHECK(hex(fiar::detail::sha256(bytes("abc"))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(fiar::detail::sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231, test cases 2 and 6 (a key longer than the block).
  CHECK(hex(fiar::detail::hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(fiar::detail::hmac_sha256(bytes(std::string(131, '\xaa')),
                                      bytes("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(fiar::detail::equal_in_constant_time(bytes("same"), bytes("same")));
  CHECK_FALSE(fiar::detail::equal_in_constant_time(bytes("same"), bytes("sane")));
}

TEST_CASE("tcp: strangers are dropped while the group forms and runs, without delay or memory growth", "[tcp]") {
  const int port = free_port();
  const long rss_before = resident_kib();
  std::atomic<bool> formed{false};
  std::atomic<int> idle_fd{-1};
  // Four strangers, one after the other, while rank 0 waits for its peers: a well-formed hello under another token
  // (claiming world size 99: it must not stop the group), garbage, a header that announces 1 GiB, and a connection
  // that says nothing and stays open.
  std::thread strangers([&] {
    auto frame = [](std::uint32_t kind, std::uint64_t bytes, std::int32_t rank, std::int32_t world) {
      fiar::detail::TcpFrame f;
      f.magic = fiar::detail::kTcpMagic;
      f.kind = kind;
      f.bytes = bytes;
      f.rank = rank;
      f.world = world;
      return f;
    };
    {
      const int c = connect_raw("127.0.0.1", port);
      fiar::detail::TcpFrame challenge;
      std::byte nonce[fiar::detail::kTcpNonceBytes];
      if (c >= 0 && ::recv(c, &challenge, sizeof(challenge), MSG_WAITALL) == sizeof(challenge) &&
          ::recv(c, nonce, sizeof(nonce), MSG_WAITALL) == sizeof(nonce)) {
        const auto hello = frame(fiar::detail::TcpFrame::kHello, fiar::detail::kTcpProofBytes, 2, 99);
        const auto proof = fiar::detail::tcp_proof("not the token", nonce, 2, 99);
        (void)::send(c, &hello, sizeof(hello), MSG_NOSIGNAL);
        (void)::send(c, proof.data(), proof.size(), MSG_NOSIGNAL);
      }
      std::this_thread::sleep_for(50ms);
      if (c >= 0) ::close(c);
    }
    {
      const int c = connect_raw("127.0.0.1", port);
      const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef";
      (void)::send(c, garbage, sizeof(garbage), MSG_NOSIGNAL);
      std::this_thread::sleep_for(50ms);
      if (c >= 0) ::close(c);
    }
    {
      const int c = connect_raw("127.0.0.1", port);
      const auto huge = frame(fiar::detail::TcpFrame::kHello, std::uint64_t{1} << 30, 1, 3);
      (void)::send(c, &huge, sizeof(huge), MSG_NOSIGNAL);
      std::this_thread::sleep_for(50ms);
      if (c >= 0) ::close(c);
    }
    idle_fd = connect_raw("127.0.0.1", port);
  });
  std::chrono::steady_clock::duration joining{};
  const auto errors = run_threads({0, 1, 2}, [&](int rank) {
    auto o = options(rank, 3, port, 10s);
    o.token = "s3cret";
    if (rank != 0) {
      // The real ranks come after the strangers (and after the idle connection is open).
      while (idle_fd.load() < 0) std::this_thread::sleep_for(5ms);
    }
    const auto start = std::chrono::steady_clock::now();
    fiar::TcpBootstrap boot(o);
    if (rank == 1) joining = std::chrono::steady_clock::now() - start;
    std::vector<std::int32_t> all(3);
    const std::int32_t mine = 10 + rank;
    boot.all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
    if (all != std::vector<std::int32_t>{10, 11, 12}) throw std::runtime_error("wrong all_gather");
    formed = true;
  });
  strangers.join();
  if (idle_fd.load() >= 0) ::close(idle_fd.load());
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(formed);
  // The idle stranger did not hold the rendezvous (it has 2 s of its own, polled beside everyone else).
  CHECK(joining < 1500ms);
  // Nothing announced by a stranger was allocated.
  CHECK(resident_kib() - rss_before < 64 * 1024);
}

TEST_CASE("tcp: a rank with another token is dropped, and rank 0's timeout says why", "[tcp]") {
  const int port = free_port();
  const auto errors = run_threads({0, 1}, [&](int rank) {
    auto o = options(rank, 2, port, 1500ms);
    o.token = rank == 0 ? "one" : "another";
    fiar::TcpBootstrap boot(o);
  });
  CAPTURE(errors[0]);
  CHECK(contains(errors[0], "missing rank(s): 1"));
  CHECK(contains(errors[0], "does not match this job's token (FIAR_BOOTSTRAP_TOKEN)"));
  CHECK_FALSE(errors[1].empty());
}

TEST_CASE("tcp: rank 0 listens only on the address master_addr resolves to", "[tcp]") {
  const int port = free_port();
  std::atomic<bool> probed{false};
  bool reachable_elsewhere = true, reachable_there = false;
  const auto errors = run_threads({0, 1}, [&](int rank) {
    if (rank == 1) {
      // 127.0.0.2 is another address of this machine (all of 127/8 is loopback): a listener bound to 127.0.0.1 is
      // not reachable there.
      const int there = connect_raw("127.0.0.1", port);
      reachable_there = there >= 0;
      if (there >= 0) ::close(there);
      const int elsewhere = connect_raw("127.0.0.2", port, 300ms);
      reachable_elsewhere = elsewhere >= 0;
      if (elsewhere >= 0) ::close(elsewhere);
      probed = true;
    }
    fiar::TcpBootstrap boot(options(rank, 2, port, 10s));
    boot.barrier();
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(probed);
  CHECK(reachable_there);
  CHECK_FALSE(reachable_elsewhere);
}

TEST_CASE("tcp: a rank and a world size from two launchers that disagree are refused, naming both", "[tcp]") {
  {
    LauncherEnv env({{"RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK_THROWS_WITH(fiar::launch_environment(),
                      Catch::Contains("RANK = 1 (torchrun) but OMPI_COMM_WORLD_RANK = 3 (Open MPI)"));
  }
  {
    LauncherEnv env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK_THROWS_WITH(fiar::launch_environment(),
                      Catch::Contains("WORLD_SIZE = 8 (torchrun) but OMPI_COMM_WORLD_SIZE = 4 (Open MPI)"));
  }
  {
    // Slurm's variables are inherited by whatever an allocation runs (mpirun inside sbatch): never a disagreement.
    LauncherEnv env({{"OMPI_COMM_WORLD_RANK", "2"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "1"},
                     {"FIAR_BOOTSTRAP_TOKEN", "t"},
                     {"FIAR_LISTEN_ALL", "1"}});
    const auto e = fiar::launch_environment();
    CHECK(e.rank == 2);
    CHECK(e.world_size == 4);
    const auto o = fiar::TcpBootstrapOptions::from_environment();
    CHECK(o.token == "t");
    CHECK(o.listen_all);
  }
}
