// SPDX-License-Identifier: Apache-2.0
// fiar/comm/tcp_bootstrap.hpp — a Bootstrap for ranks that are separate processes (one per GPU, on one node or many),
// meeting over TCP at rank 0's address, with the launch conventions users know (FIAR_*, torchrun, Open MPI, Slurm).
// Contract: rank 0 listens on the rendezvous port, every other rank connects to it; all_gather sends each block to
// rank 0, which answers every rank with all of them in rank order. Every wait (connecting, the hello, every
// collective) ends by the timeout: a rank that never arrives, leaves or dies makes every other rank throw
// fiar::timeout_error naming it, and the group is broken afterwards (every later collective throws at once).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../runtime/posix.hpp"
#include "bootstrap.hpp"

FIAR_BEGIN_NAMESPACE

/// Where this process stands in its group, as its launcher told it through the environment.
/// -1 (or "") marks what no variable gave.
struct LaunchEnvironment {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;        ///< the rank among the processes of this node (picks the GPU)
  int local_world_size = -1;  ///< processes on this node
  std::string master_addr;    ///< rank 0's host
  int master_port = -1;       ///< the port fiar's rendezvous uses (FIAR_MASTER_PORT, else MASTER_PORT + 1)
  std::string source;         ///< which launcher's variables gave the rank: "FIAR_RANK", "torchrun", "Open MPI", ...
};

namespace detail {

/// The integer in environment variable `name`, or nullopt when it is unset; a value that is not an integer in
/// [min, max] throws std::invalid_argument naming the variable.
inline std::optional<int> env_int(const char* name, int min, int max = 1 << 30) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view s(text);
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < min || v > max) {
    throw std::invalid_argument("fiar: environment variable " + std::string(name) + " = " + quoted(s) +
                                "; allowed: an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                                ". Fix: set it to a valid value or unset it.");
  }
  return v;
}

inline std::string env_text(const char* name) {
  const char* text = std::getenv(name);
  return text == nullptr ? std::string() : std::string(text);
}

}  // namespace detail

/// Reads the launcher's variables, first set wins for each field:
///   rank:        FIAR_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (MPICH), SLURM_PROCID
///   world size:  FIAR_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS
///   local rank:  FIAR_LOCAL_RANK, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
///   local size:  FIAR_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS
///   rendezvous:  FIAR_MASTER_ADDR, else MASTER_ADDR; FIAR_MASTER_PORT, else MASTER_PORT + 1 (torchrun's own store
///                listens on MASTER_PORT, so fiar's rank 0 takes the next port)
/// A set variable that is not a valid integer throws std::invalid_argument naming it.
inline LaunchEnvironment launch_environment() {
  struct Source {
    const char *rank, *size, *local_rank, *local_size, *name;
  };
  static constexpr Source kSources[] = {
      {"FIAR_RANK", "FIAR_WORLD_SIZE", "FIAR_LOCAL_RANK", "FIAR_LOCAL_WORLD_SIZE", "FIAR_RANK"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "Open MPI"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm"},
  };
  LaunchEnvironment env;
  for (const Source& s : kSources) {
    if (env.rank < 0) {
      if (const auto v = detail::env_int(s.rank, 0)) {
        env.rank = *v;
        env.source = s.name;
      }
    }
    if (env.world_size < 0) env.world_size = detail::env_int(s.size, 1).value_or(-1);
    if (env.local_rank < 0) env.local_rank = detail::env_int(s.local_rank, 0).value_or(-1);
    // Slurm's tasks-per-node can read "4(x2)": only a plain integer counts.
    if (env.local_world_size < 0 && std::string_view(s.name) != "Slurm") {
      env.local_world_size = detail::env_int(s.local_size, 1).value_or(-1);
    }
  }
  env.master_addr = detail::env_text("FIAR_MASTER_ADDR");
  if (env.master_addr.empty()) env.master_addr = detail::env_text("MASTER_ADDR");
  env.master_port = detail::env_int("FIAR_MASTER_PORT", 1, 65535).value_or(-1);
  if (env.master_port < 0) {
    if (const auto torch = detail::env_int("MASTER_PORT", 1, 65534)) env.master_port = *torch + 1;
  }
  return env;
}

/// How a TcpBootstrap finds its group.
struct TcpBootstrapOptions {
  int rank = -1;
  int world_size = -1;
  std::string master_addr = "127.0.0.1";  ///< rank 0's host name or address (IPv4 or IPv6)
  int master_port = 29600;                ///< the port rank 0 listens on (next to torchrun's default, 29500)
  /// Bounds every wait: the rendezvous (all ranks connected) and each collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);

  /// The options launch_environment() gives (master address and port default to 127.0.0.1:29600); throws
  /// std::invalid_argument when no variable gives the rank or the world size.
  static TcpBootstrapOptions from_environment(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const LaunchEnvironment env = launch_environment();
    if (env.rank < 0 || env.world_size < 0) {
      throw std::invalid_argument(
          std::string("fiar: TcpBootstrap found no ") + (env.rank < 0 ? "rank" : "world size") +
          " in the environment. Fix: launch with torchrun or mpirun, or set FIAR_RANK and FIAR_WORLD_SIZE (and "
          "FIAR_MASTER_ADDR / FIAR_MASTER_PORT, rank 0's host and a free port, default 127.0.0.1:29600).");
    }
    TcpBootstrapOptions o;
    o.rank = env.rank;
    o.world_size = env.world_size;
    if (!env.master_addr.empty()) o.master_addr = env.master_addr;
    if (env.master_port > 0) o.master_port = env.master_port;
    o.timeout = timeout;
    return o;
  }
};

namespace detail {

/// One frame of the TCP bootstrap's protocol: this header, then `bytes` of payload.
struct TcpFrame {
  enum Kind : std::uint32_t { kHello = 1, kWelcome, kBlock, kResult, kFailure };
  std::uint32_t magic = 0;  ///< kTcpMagic ("fiaT"), set by tcp_send_frame
  std::uint32_t kind = 0;
  std::uint64_t sequence = 0;  ///< the collective's number (the hello's: 0)
  std::uint64_t bytes = 0;
  std::int32_t rank = -1;  ///< the sender (hello: the rank it claims)
  std::int32_t world = 0;  ///< hello: the world size it was given; failure: 1 for std::invalid_argument
};
inline constexpr std::uint32_t kTcpMagic = 0x66696154u;
inline constexpr std::uint64_t kTcpMaxPayload = std::uint64_t{1} << 30;

/// A peer's connection ended or a wait passed its deadline, on one socket.
struct TcpLost {
  bool timed_out;
  std::string what;
};

/// Waits until fd is ready for `events` or the deadline passes; false at the deadline.
inline bool tcp_wait(int fd, short events, Deadline deadline) {
  for (;;) {
    const int left = remaining_ms(deadline);
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, left);
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return true;  // let the read or write report it
  }
}

inline void tcp_send_all(int fd, const void* data, std::size_t n, Deadline deadline) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      p += sent;
      n -= static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!tcp_wait(fd, POLLOUT, deadline)) throw TcpLost{true, "sending"};
      continue;
    }
    throw TcpLost{false, std::string("the connection closed while sending (") + std::strerror(errno) + ")"};
  }
}

inline void tcp_recv_all(int fd, void* data, std::size_t n, Deadline deadline) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<std::size_t>(got);
      continue;
    }
    if (got == 0) throw TcpLost{false, "the connection closed (the process exited or was killed)"};
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!tcp_wait(fd, POLLIN, deadline)) throw TcpLost{true, "waiting"};
      continue;
    }
    throw TcpLost{false, std::string("the connection failed (") + std::strerror(errno) + ")"};
  }
}

inline void tcp_send_frame(int fd, TcpFrame f, std::span<const std::byte> payload, Deadline deadline) {
  f.magic = kTcpMagic;
  f.bytes = payload.size();
  tcp_send_all(fd, &f, sizeof(f), deadline);
  if (!payload.empty()) tcp_send_all(fd, payload.data(), payload.size(), deadline);
}

inline TcpFrame tcp_recv_frame(int fd, std::vector<std::byte>& payload, Deadline deadline) {
  TcpFrame f;
  tcp_recv_all(fd, &f, sizeof(f), deadline);
  if (f.magic != kTcpMagic || f.bytes > kTcpMaxPayload) {
    throw TcpLost{false, "a message that is not fiar's arrived (another program uses this port?)"};
  }
  payload.resize(static_cast<std::size_t>(f.bytes));
  if (!payload.empty()) tcp_recv_all(fd, payload.data(), payload.size(), deadline);
  return f;
}

inline void tcp_configure(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace detail

/// Rank `rank` of a group of processes meeting over TCP (see the header comment); satisfies Bootstrap.
/// The constructor is collective: it returns once every rank has connected, or throws (timeout_error naming the
/// missing ranks; std::invalid_argument for options the ranks disagree on).
///
///   auto boot = fiar::TcpBootstrap(fiar::TcpBootstrapOptions::from_environment());
class TcpBootstrap {
 public:
  explicit TcpBootstrap(const TcpBootstrapOptions& options) : options_(options) {
    const auto& o = options_;
    if (o.world_size < 1) {
      throw std::invalid_argument("fiar: TcpBootstrap world_size = " + std::to_string(o.world_size) +
                                  "; allowed: 1 or more. Fix: pass the number of processes in the group "
                                  "(FIAR_WORLD_SIZE).");
    }
    if (o.rank < 0 || o.rank >= o.world_size) {
      throw std::invalid_argument("fiar: TcpBootstrap rank = " + std::to_string(o.rank) + "; allowed: 0 to " +
                                  std::to_string(o.world_size - 1) + " for a group of " + std::to_string(o.world_size) +
                                  ". Fix: give each process its own rank (FIAR_RANK).");
    }
    if (o.master_port < 1 || o.master_port > 65535) {
      throw std::invalid_argument("fiar: TcpBootstrap master_port = " + std::to_string(o.master_port) +
                                  "; allowed: 1 to 65535. Fix: pick a free port (FIAR_MASTER_PORT).");
    }
    if (o.timeout.count() <= 0) {
      throw std::invalid_argument("fiar: TcpBootstrap timeout = " + std::to_string(o.timeout.count()) +
                                  " ms; allowed: more than 0 ms.");
    }
    if (o.world_size == 1) return;
    if (o.rank == 0) {
      accept_peers();
    } else {
      connect_to_root();
    }
  }
  TcpBootstrap(TcpBootstrap&&) noexcept = default;
  TcpBootstrap& operator=(TcpBootstrap&&) noexcept = default;

  [[nodiscard]] int rank() const noexcept { return options_.rank; }
  [[nodiscard]] int size() const noexcept { return options_.world_size; }
  [[nodiscard]] const TcpBootstrapOptions& options() const noexcept { return options_; }

  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    detail::check_gather_output(rank(), size(), in, out);
    if (!broken_.empty()) throw timeout_error(broken_);
    ++sequence_;
    if (size() == 1) {
      if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
      return;
    }
    if (rank() == 0) {
      gather_as_root(in, out);
    } else {
      gather_as_peer(in, out);
    }
  }

  void barrier() { all_gather({}, {}); }

 private:
  using Clock = std::chrono::steady_clock;

  [[nodiscard]] std::string where() const { return options_.master_addr + ":" + std::to_string(options_.master_port); }

  [[noreturn]] void fail(std::string text, bool invalid = false) {
    broken_ = text;
    if (invalid) throw std::invalid_argument(text);
    throw timeout_error(text);
  }

  // Rank 0 tells every connected peer why the group ends, then closes every connection.
  [[noreturn]] void fail_group(const std::string& text, bool invalid = false) {
    for (auto& c : peers_) {
      if (c.valid()) send_failure(c.get(), text, invalid);
    }
    peers_.clear();
    fail(text, invalid);
  }

  // Best effort: the peer may be gone already.
  void send_failure(int fd, const std::string& text, bool invalid) const {
    try {
      detail::TcpFrame f;
      f.kind = detail::TcpFrame::kFailure;
      f.sequence = sequence_;
      f.rank = 0;
      f.world = invalid ? 1 : 0;
      detail::tcp_send_frame(fd, f, std::as_bytes(std::span(text.data(), text.size())),
                             Clock::now() + std::chrono::milliseconds(200));
    } catch (const detail::TcpLost&) {
    }
  }

  // ---- rendezvous ----

  void accept_peers() {
    const auto deadline = Clock::now() + options_.timeout;
    listener_ = listen_on(options_.master_port);
    peers_.resize(static_cast<std::size_t>(size()));
    int joined = 0;
    std::vector<std::byte> payload;
    while (joined < size() - 1) {
      if (!detail::tcp_wait(listener_.get(), POLLIN, deadline)) {
        fail_group("fiar: TcpBootstrap rendezvous timed out after " + std::to_string(options_.timeout.count()) +
                   " ms on rank 0 (listening on port " + std::to_string(options_.master_port) +
                   "): " + std::to_string(joined + 1) + " of " + std::to_string(size()) +
                   " ranks arrived; missing rank(s): " + missing_peers() +
                   ". Fix: start every rank with the same FIAR_WORLD_SIZE and FIAR_MASTER_ADDR:FIAR_MASTER_PORT "
                   "(this rank's host and port), or raise the timeout.");
      }
      detail::UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) continue;
      detail::tcp_configure(c.get());
      detail::TcpFrame hello;
      try {
        // A connection that is not a fiar rank (a port scanner) gets a short wait, then is dropped.
        hello = detail::tcp_recv_frame(c.get(), payload,
                                       std::min(deadline, Clock::now() + std::chrono::milliseconds(5000)));
      } catch (const detail::TcpLost&) {
        continue;
      }
      if (hello.kind != detail::TcpFrame::kHello) continue;
      std::string problem;
      if (hello.world != size()) {
        problem = "rank " + std::to_string(hello.rank) + " was started with world size " + std::to_string(hello.world) +
                  ", rank 0 with " + std::to_string(size());
      } else if (hello.rank <= 0 || hello.rank >= size()) {
        problem = "a process claims rank " + std::to_string(hello.rank) + "; allowed: 1 to " +
                  std::to_string(size() - 1) + " (rank 0 is the one listening)";
      } else if (peers_[static_cast<std::size_t>(hello.rank)].valid()) {
        problem = "two processes claim rank " + std::to_string(hello.rank);
      }
      if (!problem.empty()) {
        const std::string text = "fiar: TcpBootstrap rendezvous on port " + std::to_string(options_.master_port) +
                                 ": " + problem + ". Fix: give every process the same world size and its own rank.";
        send_failure(c.get(), text, true);
        fail_group(text, true);
      }
      peers_[static_cast<std::size_t>(hello.rank)] = std::move(c);
      ++joined;
    }
    listener_ = detail::UniqueFd();  // nobody else may join
    detail::TcpFrame welcome;
    welcome.kind = detail::TcpFrame::kWelcome;
    welcome.rank = 0;
    welcome.world = size();
    for (int r = 1; r < size(); ++r) send_or_fail(r, welcome, {}, deadline);
  }

  [[nodiscard]] std::string missing_peers() const {
    std::vector<int> missing;
    for (int r = 1; r < size(); ++r) {
      if (static_cast<std::size_t>(r) >= peers_.size() || !peers_[static_cast<std::size_t>(r)].valid()) {
        missing.push_back(r);
      }
    }
    return detail::rank_list(missing);
  }

  detail::UniqueFd listen_on(int port) {
    // Dual-stack where IPv6 exists, so that FIAR_MASTER_ADDR may name rank 0 by either family.
    for (int family : {AF_INET6, AF_INET}) {
      detail::UniqueFd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s.valid()) continue;
      const int one = 1, zero = 0;
      (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      int rc = -1;
      if (family == AF_INET6) {
        (void)::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons(static_cast<std::uint16_t>(port));
        rc = ::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a));
      } else {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        rc = ::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a));
      }
      if (rc != 0) {
        const int error = errno;
        if (error == EAFNOSUPPORT || error == EADDRNOTAVAIL) continue;
        throw std::runtime_error("fiar: TcpBootstrap rank 0 cannot listen on port " + std::to_string(port) + ": " +
                                 std::strerror(error) +
                                 (error == EADDRINUSE ? ". Fix: another program (or an earlier group still "
                                                        "running) uses it; set FIAR_MASTER_PORT to a free port."
                                                      : "."));
      }
      if (::listen(s.get(), std::min(size(), 1024)) != 0) {
        throw std::runtime_error("fiar: TcpBootstrap listen on port " + std::to_string(port) +
                                 " failed: " + std::strerror(errno));
      }
      return s;
    }
    throw std::runtime_error("fiar: TcpBootstrap rank 0 found no IPv6 or IPv4 socket to listen on port " +
                             std::to_string(port) + ".");
  }

  void connect_to_root() {
    const auto deadline = Clock::now() + options_.timeout;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(options_.master_port);
    if (const int rc = ::getaddrinfo(options_.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
      throw std::invalid_argument("fiar: TcpBootstrap master_addr " + detail::quoted(options_.master_addr) +
                                  " does not resolve: " + ::gai_strerror(rc) +
                                  ". Fix: set FIAR_MASTER_ADDR to rank 0's host name or address.");
    }
    std::vector<std::pair<sockaddr_storage, socklen_t>> addresses;
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      sockaddr_storage s{};
      std::memcpy(&s, a->ai_addr, a->ai_addrlen);
      addresses.emplace_back(s, a->ai_addrlen);
    }
    ::freeaddrinfo(found);
    std::string last = "not reachable";
    for (;;) {
      for (const auto& [address, length] : addresses) {
        detail::UniqueFd s(::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!s.valid()) continue;
        int rc = ::connect(s.get(), reinterpret_cast<const sockaddr*>(&address), length);
        if (rc != 0 && errno == EINPROGRESS) {
          // Each attempt is bounded by a second and by the deadline.
          if (detail::tcp_wait(s.get(), POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(1)))) {
            int error = 0;
            socklen_t n = sizeof(error);
            (void)::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &error, &n);
            rc = error == 0 ? 0 : -1;
            errno = error;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0) {
          detail::tcp_configure(s.get());
          root_ = std::move(s);
          break;
        }
        last = std::strerror(errno);
      }
      if (root_.valid()) break;
      if (detail::remaining_ms(deadline) == 0) {
        fail("fiar: TcpBootstrap rank " + std::to_string(rank()) + " could not reach rank 0 at " + where() +
             " within " + std::to_string(options_.timeout.count()) + " ms (" + last +
             "). Fix: start rank 0 too, with the same FIAR_MASTER_ADDR and FIAR_MASTER_PORT, reachable from here.");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    detail::TcpFrame hello;
    hello.kind = detail::TcpFrame::kHello;
    hello.rank = rank();
    hello.world = size();
    std::vector<std::byte> payload;
    try {
      detail::tcp_send_frame(root_.get(), hello, {}, deadline);
      // Rank 0 answers once the last rank has arrived: wait a little past its own deadline for its verdict.
      const detail::TcpFrame f = detail::tcp_recv_frame(root_.get(), payload, deadline + grace());
      if (f.kind == detail::TcpFrame::kFailure) fail(text_of(payload), f.world == 1);
      if (f.kind != detail::TcpFrame::kWelcome) {
        fail("fiar: TcpBootstrap rank " + std::to_string(rank()) + ": rank 0 at " + where() +
             " answered the hello with something else. Fix: make sure every rank runs the same fiar version.");
      }
    } catch (const detail::TcpLost& lost) {
      fail("fiar: TcpBootstrap rendezvous failed on rank " + std::to_string(rank()) + ": rank 0 at " + where() + " " +
           (lost.timed_out
                ? "did not confirm that every rank arrived within " + std::to_string(options_.timeout.count()) + " ms"
                : ": " + lost.what) +
           ". Fix: start every rank with the same FIAR_WORLD_SIZE.");
    }
  }

  [[nodiscard]] std::chrono::milliseconds grace() const {
    return std::clamp(options_.timeout / 10, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
  }

  static std::string text_of(const std::vector<std::byte>& payload) {
    return std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
  }

  void send_or_fail(int r, const detail::TcpFrame& f, std::span<const std::byte> payload, Clock::time_point deadline) {
    try {
      detail::tcp_send_frame(peers_[static_cast<std::size_t>(r)].get(), f, payload, deadline);
    } catch (const detail::TcpLost& lost) {
      peers_[static_cast<std::size_t>(r)] = detail::UniqueFd();
      fail_group("fiar: TcpBootstrap collective " + std::to_string(sequence_) + ": rank " + std::to_string(r) +
                 " left the group: " + (lost.timed_out ? "it stopped reading" : lost.what) +
                 ". The group is unusable now.");
    }
  }

  // ---- collectives ----

  void gather_as_root(std::span<const std::byte> in, std::span<std::byte> out) {
    const auto deadline = Clock::now() + options_.timeout;
    const std::size_t n = static_cast<std::size_t>(size());
    std::vector<std::vector<std::byte>> blocks(n);
    std::vector<bool> arrived(n, false);
    blocks[0].assign(in.begin(), in.end());
    arrived[0] = true;
    std::size_t waiting = n - 1;
    std::vector<pollfd> fds;
    std::vector<int> rank_of;  // rank_of[i]: the rank whose connection fds[i] polls
    while (waiting > 0) {
      fds.clear();
      rank_of.clear();
      for (std::size_t r = 1; r < n; ++r) {
        if (arrived[r]) continue;
        fds.push_back(pollfd{peers_[r].get(), POLLIN, 0});
        rank_of.push_back(static_cast<int>(r));
      }
      const int ready = ::poll(fds.data(), fds.size(), detail::remaining_ms(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        fail_group("fiar: TcpBootstrap collective " + std::to_string(sequence_) + " timed out after " +
                   std::to_string(options_.timeout.count()) + " ms on rank 0: " + std::to_string(n - waiting) + " of " +
                   std::to_string(n) + " ranks arrived; missing rank(s): " + detail::rank_list(rank_of) +
                   ". A rank hung or called a different collective; the group is unusable now.");
      }
      for (std::size_t i = 0; i < fds.size(); ++i) {
        const pollfd& p = fds[i];
        if (p.revents == 0) continue;
        const auto r = static_cast<std::size_t>(rank_of[i]);
        try {
          const detail::TcpFrame f = detail::tcp_recv_frame(p.fd, blocks[r], deadline);
          if (f.kind != detail::TcpFrame::kBlock || f.sequence != sequence_) {
            throw detail::TcpLost{false, "it sent collective " + std::to_string(f.sequence) + " while rank 0 is at " +
                                             std::to_string(sequence_)};
          }
        } catch (const detail::TcpLost& lost) {
          peers_[r] = detail::UniqueFd();
          fail_group("fiar: TcpBootstrap collective " + std::to_string(sequence_) + ": rank " + std::to_string(r) +
                     " left the group: " + (lost.timed_out ? "it stopped sending" : lost.what) +
                     ". The group is unusable now.");
        }
        arrived[r] = true;
        --waiting;
      }
    }
    for (std::size_t r = 1; r < n; ++r) {
      if (blocks[r].size() != in.size()) {
        fail_group("fiar: all_gather block sizes differ: rank 0 gave " + std::to_string(in.size()) + " bytes, rank " +
                       std::to_string(r) + " gave " + std::to_string(blocks[r].size()) +
                       " bytes. Fix: every rank must pass the same number of bytes to each collective.",
                   true);
      }
    }
    std::vector<std::byte> all;
    all.reserve(in.size() * n);
    for (const auto& b : blocks) all.insert(all.end(), b.begin(), b.end());
    detail::TcpFrame result;
    result.kind = detail::TcpFrame::kResult;
    result.sequence = sequence_;
    result.rank = 0;
    for (int r = 1; r < size(); ++r) send_or_fail(r, result, all, deadline);
    if (!all.empty()) std::memcpy(out.data(), all.data(), all.size());
  }

  void gather_as_peer(std::span<const std::byte> in, std::span<std::byte> out) {
    const auto deadline = Clock::now() + options_.timeout;
    std::vector<std::byte> payload;
    try {
      detail::TcpFrame f;
      f.kind = detail::TcpFrame::kBlock;
      f.sequence = sequence_;
      f.rank = rank();
      detail::tcp_send_frame(root_.get(), f, in, deadline);
      // Rank 0 decides on timeouts: its verdict (naming the missing ranks) may come a little after ours.
      const detail::TcpFrame r = detail::tcp_recv_frame(root_.get(), payload, deadline + grace());
      if (r.kind == detail::TcpFrame::kFailure) {
        root_ = detail::UniqueFd();
        fail(text_of(payload), r.world == 1);
      }
      if (r.kind != detail::TcpFrame::kResult || r.sequence != sequence_ || payload.size() != out.size()) {
        throw detail::TcpLost{false, "it answered collective " + std::to_string(sequence_) + " with " +
                                         std::to_string(payload.size()) + " bytes of collective " +
                                         std::to_string(r.sequence)};
      }
    } catch (const detail::TcpLost& lost) {
      // Rank 0 may have said why before it closed (its verdict waits in the socket even when sending failed).
      try {
        const detail::TcpFrame r =
            detail::tcp_recv_frame(root_.get(), payload, Clock::now() + std::chrono::milliseconds(100));
        if (r.kind == detail::TcpFrame::kFailure) {
          root_ = detail::UniqueFd();
          fail(text_of(payload), r.world == 1);
        }
      } catch (const detail::TcpLost&) {
      }
      root_ = detail::UniqueFd();
      fail("fiar: TcpBootstrap collective " + std::to_string(sequence_) + " on rank " + std::to_string(rank()) +
           ": rank 0 (" + where() + ") " +
           (lost.timed_out ? "did not answer within " + std::to_string((options_.timeout + grace()).count()) + " ms"
                           : std::string("failed: ") + lost.what) +
           ". The group is unusable now.");
    }
    if (!payload.empty()) std::memcpy(out.data(), payload.data(), payload.size());
  }

  TcpBootstrapOptions options_;
  detail::UniqueFd listener_;            // rank 0, during the rendezvous
  std::vector<detail::UniqueFd> peers_;  // rank 0: the connection of each rank (index 0 unused)
  detail::UniqueFd root_;                // other ranks: the connection to rank 0
  std::uint64_t sequence_ = 0;           // collectives this rank has entered
  std::string broken_;                   // why the group is unusable ("" while it works)
};

static_assert(Bootstrap<TcpBootstrap>);

FIAR_END_NAMESPACE
