// SPDX-License-Identifier: Apache-2.0
// fiar/comm/tcp_bootstrap.hpp — a Bootstrap for ranks that are separate processes (one per GPU, on one node or many),
// meeting over TCP at rank 0's address, with the launch conventions users know (FIAR_*, torchrun, Open MPI, Slurm).
// Contract: rank 0 listens on the rendezvous port of the addresses master_addr resolves to (every interface only with
// listen_all), every other rank connects and proves it knows the job's token (HMAC-SHA-256 of rank 0's challenge);
// a connection that does not prove itself is dropped without failing, delaying or growing the group. all_gather
// sends each block to rank 0, which answers every rank with all of them in rank order; no frame larger than the
// protocol expects is read. Every wait (the name lookup, connecting, the hello, every collective) ends by the
// timeout: a rank that never arrives, leaves or dies makes every other rank throw fiar::timeout_error naming it, and
// the group is broken afterwards (every later collective throws at once).
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
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/log.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../runtime/posix.hpp"
#include "auth.hpp"
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

/// Reads the launcher's variables. The rank and the world size come from one source, the first that sets a rank:
///   rank:        FIAR_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (MPICH), SLURM_PROCID
///   world size:  FIAR_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS
///   local rank:  FIAR_LOCAL_RANK, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
///   local size:  FIAR_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS
///   rendezvous:  FIAR_MASTER_ADDR, else MASTER_ADDR; FIAR_MASTER_PORT, else MASTER_PORT + 1 (torchrun's own store
///                listens on MASTER_PORT, so fiar's rank 0 takes the next port)
/// (fiar's own variables may take the world size from a launcher; the local rank and size: first set wins). Two
/// launchers whose rank or world size disagree (variables inherited from another launch) throw
/// std::invalid_argument naming both, as does a set variable that is not a valid integer.
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
  const Source* chosen = nullptr;
  for (const Source& s : kSources) {
    if (chosen == nullptr) {
      if (const auto v = detail::env_int(s.rank, 0)) {
        env.rank = *v;
        env.source = s.name;
        chosen = &s;
        env.world_size = detail::env_int(s.size, 1).value_or(-1);
      }
    } else if (chosen == &kSources[0] && env.world_size < 0) {
      env.world_size = detail::env_int(s.size, 1).value_or(-1);  // FIAR_RANK with the launcher's size
    }
    if (env.local_rank < 0) env.local_rank = detail::env_int(s.local_rank, 0).value_or(-1);
    // Slurm's tasks-per-node can read "4(x2)": only a plain integer counts.
    if (env.local_world_size < 0 && std::string_view(s.name) != "Slurm") {
      env.local_world_size = detail::env_int(s.local_size, 1).value_or(-1);
    }
  }
  // A launcher's rank with another launcher's rank or size that disagrees: variables of two launches. (fiar's own
  // variables override on purpose; Slurm's are inherited by every program of an allocation, mpirun's included.)
  if (chosen != nullptr && chosen != &kSources[0]) {
    for (const Source& s : kSources) {
      if (&s == chosen || &s == &kSources[0] || std::string_view(s.name) == "Slurm") continue;
      const auto their_rank = detail::env_int(s.rank, 0);
      const auto their_size = detail::env_int(s.size, 1);
      const bool rank_differs = their_rank && *their_rank != env.rank;
      const bool size_differs = their_size && *their_size != env.world_size;
      if (!rank_differs && !size_differs) continue;
      auto var = [](const char* name, int value) {
        return std::string(name) + (value < 0 ? std::string(" unset") : " = " + std::to_string(value));
      };
      throw std::invalid_argument(
          "fiar: the launchers' variables disagree: " +
          (rank_differs ? var(chosen->rank, env.rank) : var(chosen->size, env.world_size)) + " (" + chosen->name +
          ") but " + (rank_differs ? var(s.rank, *their_rank) : var(s.size, *their_size)) + " (" + s.name +
          "). Fix: unset the variables of the launcher that did not start this process, or set FIAR_RANK and "
          "FIAR_WORLD_SIZE, which take precedence.");
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
  /// The job's secret, the same on every rank (FIAR_BOOTSTRAP_TOKEN): a connection joins only by proving it knows it
  /// (an HMAC-SHA-256 of rank 0's challenge). Empty: no proof, fine on loopback; rank 0 warns once when it listens
  /// beyond loopback without one.
  std::string token;
  /// Rank 0 listens on every interface (FIAR_LISTEN_ALL=1) instead of the address master_addr resolves to.
  bool listen_all = false;

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
    o.token = detail::env_text("FIAR_BOOTSTRAP_TOKEN");
    o.listen_all = detail::env_int("FIAR_LISTEN_ALL", 0, 1).value_or(0) == 1;
    return o;
  }
};

namespace detail {

/// One frame of the TCP bootstrap's protocol: this header, then `bytes` of payload.
struct TcpFrame {
  enum Kind : std::uint32_t { kHello = 1, kWelcome, kBlock, kResult, kFailure, kChallenge };
  std::uint32_t magic = 0;  ///< kTcpMagic ("fiaT"), set by tcp_send_frame
  std::uint32_t kind = 0;
  std::uint64_t sequence = 0;  ///< the collective's number (the hello's: 0)
  std::uint64_t bytes = 0;
  std::int32_t rank = -1;  ///< the sender (hello: the rank it claims)
  std::int32_t world = 0;  ///< hello: the world size it was given; failure: 1 for std::invalid_argument
};
inline constexpr std::uint32_t kTcpMagic = 0x66696154u;
inline constexpr std::size_t kTcpNonceBytes = 16;  ///< rank 0's challenge to each connection
inline constexpr std::size_t kTcpProofBytes = 32;  ///< the hello's HMAC-SHA-256 of the challenge under the token
inline constexpr std::size_t kTcpMaxText = 16384;  ///< a failure frame's message
inline constexpr std::size_t kTcpMaxPending = 64;  ///< connections rank 0 holds before they prove themselves
inline constexpr std::chrono::milliseconds kTcpHelloWait{2000};  ///< how long a new connection has for its hello

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

/// A frame's header; its payload is still to be read (tcp_recv_payload), once its size is known to be expected.
inline TcpFrame tcp_recv_header(int fd, Deadline deadline) {
  TcpFrame f;
  tcp_recv_all(fd, &f, sizeof(f), deadline);
  if (f.magic != kTcpMagic)
    throw TcpLost{false, "a message that is not fiar's arrived (another program uses this port?)"};
  return f;
}

/// The payload of a frame whose header said `f.bytes`, at most `max_bytes` (checked before a byte is allocated).
inline void tcp_recv_payload(int fd, const TcpFrame& f, std::vector<std::byte>& payload, std::size_t max_bytes,
                             Deadline deadline) {
  if (f.bytes > max_bytes) {
    throw TcpLost{false, "a frame of " + std::to_string(f.bytes) + " bytes arrived where at most " +
                             std::to_string(max_bytes) + " were expected"};
  }
  payload.resize(static_cast<std::size_t>(f.bytes));
  if (!payload.empty()) tcp_recv_all(fd, payload.data(), payload.size(), deadline);
}

inline TcpFrame tcp_recv_frame(int fd, std::vector<std::byte>& payload, std::size_t max_bytes, Deadline deadline) {
  const TcpFrame f = tcp_recv_header(fd, deadline);
  tcp_recv_payload(fd, f, payload, max_bytes, deadline);
  return f;
}

/// The proof a hello carries: HMAC-SHA-256 under the job's token of rank 0's challenge, the rank and the world size.
inline Digest256 tcp_proof(const std::string& token, std::span<const std::byte> nonce, std::int32_t rank,
                           std::int32_t world) {
  std::byte message[kTcpNonceBytes + 8] = {};
  std::memcpy(message, nonce.data(), std::min(nonce.size(), kTcpNonceBytes));
  std::memcpy(message + kTcpNonceBytes, &rank, 4);
  std::memcpy(message + kTcpNonceBytes + 4, &world, 4);
  return hmac_sha256(std::as_bytes(std::span(token.data(), token.size())), message);
}

/// Resolves host:port (a numeric address needs no lookup); a name lookup is bounded by the deadline (it runs on a
/// thread of its own, left to finish alone when the deadline passes). Throws std::invalid_argument when the name
/// does not resolve, fiar::timeout_error when the lookup outlasts the deadline.
inline std::vector<std::pair<sockaddr_storage, socklen_t>> tcp_resolve(const std::string& host, int port,
                                                                       Deadline deadline) {
  struct Lookup {
    std::mutex m;
    std::condition_variable done;
    bool finished = false;
    int rc = 0;
    std::vector<std::pair<sockaddr_storage, socklen_t>> found;
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host, port] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    std::vector<std::pair<sockaddr_storage, socklen_t>> addresses;
    for (addrinfo* a = rc == 0 ? found : nullptr; a != nullptr; a = a->ai_next) {
      sockaddr_storage s{};
      std::memcpy(&s, a->ai_addr, a->ai_addrlen);
      addresses.emplace_back(s, a->ai_addrlen);
    }
    if (found != nullptr) ::freeaddrinfo(found);
    const std::lock_guard lock(lookup->m);
    lookup->rc = rc;
    lookup->found = std::move(addresses);
    lookup->finished = true;
    lookup->done.notify_all();
  }).detach();
  std::unique_lock lock(lookup->m);
  if (!lookup->done.wait_until(lock, deadline, [&] { return lookup->finished; })) {
    throw timeout_error("fiar: TcpBootstrap master_addr " + quoted(host) +
                        " did not resolve within the timeout (the name service does not answer). Fix: set "
                        "FIAR_MASTER_ADDR to rank 0's address, or repair the host's name service.");
  }
  if (lookup->rc != 0 || lookup->found.empty()) {
    throw std::invalid_argument("fiar: TcpBootstrap master_addr " + quoted(host) +
                                " does not resolve: " + ::gai_strerror(lookup->rc) +
                                ". Fix: set FIAR_MASTER_ADDR to rank 0's host name or address.");
  }
  return std::move(lookup->found);
}

/// Whether an address is a loopback one (127.0.0.0/8, ::1, or IPv4-mapped loopback).
inline bool tcp_is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
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

  // A connection that has not proven itself yet: rank 0's challenge sent, its hello being read.
  struct Pending {
    detail::UniqueFd fd;
    Clock::time_point deadline;
    std::array<std::byte, detail::kTcpNonceBytes> nonce{};
    std::array<std::byte, sizeof(detail::TcpFrame) + detail::kTcpProofBytes> hello{};
    std::size_t got = 0;
  };

  // Rank 0: accepts connections until every rank has joined. Each new connection gets a challenge and has
  // kTcpHelloWait for its hello (header and proof: a fixed size, read into a fixed buffer). What does not prove
  // itself (a wrong token, a malformed or oversized frame, silence) is dropped and logged at debug level; it never
  // fails the group and never delays the others: every pending connection is polled with the listeners.
  void accept_peers() {
    const auto deadline = Clock::now() + options_.timeout;
    listeners_ = listen();
    peers_.resize(static_cast<std::size_t>(size()));
    std::vector<Pending> pending;
    std::vector<pollfd> fds;
    int joined = 0;
    while (joined < size() - 1) {
      fds.clear();
      for (const auto& l : listeners_) fds.push_back(pollfd{l.get(), POLLIN, 0});
      Clock::time_point wake = deadline;
      for (const auto& c : pending) {
        fds.push_back(pollfd{c.fd.get(), POLLIN, 0});
        wake = std::min(wake, c.deadline);
      }
      if (::poll(fds.data(), fds.size(), detail::remaining_ms(wake)) < 0 && errno != EINTR) {
        fail_group(std::string("fiar: TcpBootstrap rendezvous on rank 0 failed: poll: ") + std::strerror(errno));
      }
      const auto now = Clock::now();
      const std::size_t polled = pending.size();  // admit() appends connections polled from the next round on
      for (std::size_t i = 0; i < listeners_.size(); ++i) {
        if (fds[i].revents != 0) admit(listeners_[i].get(), pending, now);
      }
      std::size_t kept = 0;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        int verdict = 0;
        if (i < polled && fds[listeners_.size() + i].revents != 0) {
          verdict = read_hello(pending[i]);
        } else if (pending[i].deadline <= now) {
          drop("it sent no hello within the hello's wait");
          verdict = -1;
        }
        if (verdict > 0) ++joined;
        if (verdict != 0) continue;
        if (kept != i) pending[kept] = std::move(pending[i]);
        ++kept;
      }
      pending.resize(kept);
      if (joined < size() - 1 && Clock::now() >= deadline) {
        fail_group("fiar: TcpBootstrap rendezvous timed out after " + std::to_string(options_.timeout.count()) +
                   " ms on rank 0 (listening on port " + std::to_string(options_.master_port) +
                   "): " + std::to_string(joined + 1) + " of " + std::to_string(size()) +
                   " ranks arrived; missing rank(s): " + missing_peers() + dropped_text() +
                   ". Fix: start every rank with the same FIAR_WORLD_SIZE and FIAR_MASTER_ADDR:FIAR_MASTER_PORT "
                   "(this rank's host and port), or raise the timeout.");
      }
    }
    listeners_.clear();  // nobody else may join
    detail::TcpFrame welcome;
    welcome.kind = detail::TcpFrame::kWelcome;
    welcome.rank = 0;
    welcome.world = size();
    for (int r = 1; r < size(); ++r) send_or_fail(r, welcome, {}, deadline);
  }

  // Accepts one connection and sends it a challenge (over the bound of pending connections: closed at once).
  void admit(int listener, std::vector<Pending>& pending, Clock::time_point now) {
    detail::UniqueFd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) return;
    if (pending.size() >= detail::kTcpMaxPending) return drop("too many connections are waiting to prove themselves");
    detail::tcp_configure(c.get());
    Pending p;
    p.deadline = std::min(now + detail::kTcpHelloWait, now + options_.timeout);
    detail::random_bytes(p.nonce);
    detail::TcpFrame challenge;
    challenge.kind = detail::TcpFrame::kChallenge;
    challenge.rank = 0;
    challenge.world = size();
    try {
      detail::tcp_send_frame(c.get(), challenge, p.nonce, now + std::chrono::milliseconds(100));
    } catch (const detail::TcpLost&) {
      return drop("it did not take rank 0's challenge");
    }
    p.fd = std::move(c);
    pending.push_back(std::move(p));
  }

  // Reads what a pending connection sent: 0 while its hello is incomplete, 1 when it joined, -1 when it was dropped.
  // A proven hello (or any well-formed one when there is no token) that contradicts the group fails the group.
  int read_hello(Pending& c) {
    const ssize_t got = ::recv(c.fd.get(), c.hello.data() + c.got, c.hello.size() - c.got, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      drop("it closed before its hello");
      return -1;
    }
    if (got < 0) return 0;
    c.got += static_cast<std::size_t>(got);
    detail::TcpFrame hello;
    if (c.got >= sizeof(hello)) {
      std::memcpy(&hello, c.hello.data(), sizeof(hello));
      if (hello.magic != detail::kTcpMagic || hello.kind != detail::TcpFrame::kHello ||
          hello.bytes != detail::kTcpProofBytes) {
        drop("its first frame is not a hello of fiar's protocol");
        return -1;
      }
    }
    if (c.got < c.hello.size()) return 0;
    const std::span<const std::byte> proof(c.hello.data() + sizeof(hello), detail::kTcpProofBytes);
    if (!options_.token.empty() &&
        !detail::equal_in_constant_time(proof, detail::tcp_proof(options_.token, c.nonce, hello.rank, hello.world))) {
      drop("its proof does not match this job's token (FIAR_BOOTSTRAP_TOKEN)");
      return -1;
    }
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
      const std::string text = "fiar: TcpBootstrap rendezvous on port " + std::to_string(options_.master_port) + ": " +
                               problem + ". Fix: give every process the same world size and its own rank.";
      send_failure(c.fd.get(), text, true);
      fail_group(text, true);
    }
    peers_[static_cast<std::size_t>(hello.rank)] = std::move(c.fd);
    return 1;
  }

  // A connection that did not prove itself: closed by the caller, counted for the timeout message, logged at debug.
  void drop(const char* why) {
    ++dropped_;
    last_dropped_ = why;
    if (log_enabled(LogLevel::Debug)) {
      log(LogLevel::Debug,
          "TcpBootstrap rank 0 dropped a connection on port " + std::to_string(options_.master_port) + ": " + why);
    }
  }
  [[nodiscard]] std::string dropped_text() const {
    if (dropped_ == 0) return "";
    return " (" + std::to_string(dropped_) +
           " connection(s) that did not prove themselves were dropped; the last: " + last_dropped_ + ")";
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

  // Rank 0's listening sockets: on the addresses master_addr resolves to (loopback stays loopback), or with
  // listen_all on every interface (dual-stack where IPv6 exists). Warns once when the rendezvous is reachable beyond
  // loopback without a token.
  std::vector<detail::UniqueFd> listen() {
    const int port = options_.master_port;
    std::vector<std::pair<sockaddr_storage, socklen_t>> addresses;
    if (options_.listen_all) {
      sockaddr_storage any{};
      auto& a6 = reinterpret_cast<sockaddr_in6&>(any);
      a6.sin6_family = AF_INET6;
      a6.sin6_addr = in6addr_any;
      a6.sin6_port = htons(static_cast<std::uint16_t>(port));
      addresses.emplace_back(any, static_cast<socklen_t>(sizeof(sockaddr_in6)));
      sockaddr_storage any4{};
      auto& a4 = reinterpret_cast<sockaddr_in&>(any4);
      a4.sin_family = AF_INET;
      a4.sin_addr.s_addr = htonl(INADDR_ANY);
      a4.sin_port = htons(static_cast<std::uint16_t>(port));
      addresses.emplace_back(any4, static_cast<socklen_t>(sizeof(sockaddr_in)));
    } else {
      addresses = detail::tcp_resolve(options_.master_addr, port, Clock::now() + options_.timeout);
    }
    std::vector<detail::UniqueFd> listening;
    bool beyond_loopback = options_.listen_all;
    int last_error = EADDRNOTAVAIL;
    for (const auto& [address, length] : addresses) {
      detail::UniqueFd s(::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s.valid()) continue;
      const int one = 1, zero = 0;
      (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (address.ss_family == AF_INET6) (void)::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
        last_error = errno;
        if (last_error == EAFNOSUPPORT || last_error == EADDRNOTAVAIL || last_error == EINVAL ||
            (options_.listen_all && last_error == EADDRINUSE && !listening.empty())) {
          continue;  // a family this host lacks, or the dual-stack socket already covers IPv4
        }
        throw std::runtime_error("fiar: TcpBootstrap rank 0 cannot listen on port " + std::to_string(port) + ": " +
                                 std::strerror(last_error) +
                                 (last_error == EADDRINUSE ? ". Fix: another program (or an earlier group still "
                                                             "running) uses it; set FIAR_MASTER_PORT to a free port."
                                                           : "."));
      }
      if (::listen(s.get(), std::min(size(), 1024)) != 0) {
        throw std::runtime_error("fiar: TcpBootstrap listen on port " + std::to_string(port) +
                                 " failed: " + std::strerror(errno));
      }
      beyond_loopback = beyond_loopback || !detail::tcp_is_loopback(address);
      listening.push_back(std::move(s));
    }
    if (listening.empty()) {
      throw std::runtime_error("fiar: TcpBootstrap rank 0 found no address of " + detail::quoted(options_.master_addr) +
                               " to listen on port " + std::to_string(port) + " (" + std::strerror(last_error) +
                               "). Fix: set FIAR_MASTER_ADDR to an address of rank 0's host, or FIAR_LISTEN_ALL=1.");
    }
    if (beyond_loopback && options_.token.empty()) {
      log(LogLevel::Warning, "TcpBootstrap rank 0 listens on port " + std::to_string(port) +
                                 " beyond loopback without a token: any host that reaches the port can join the "
                                 "group. Fix: set FIAR_BOOTSTRAP_TOKEN to one secret on every rank of the job.");
    }
    return listening;
  }

  void connect_to_root() {
    const auto deadline = Clock::now() + options_.timeout;
    const auto addresses = detail::tcp_resolve(options_.master_addr, options_.master_port, deadline);
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
    std::vector<std::byte> payload;
    try {
      // Rank 0's challenge comes at once; the hello answers it with the proof of the token.
      const detail::TcpFrame challenge =
          detail::tcp_recv_frame(root_.get(), payload, detail::kTcpNonceBytes, deadline + grace());
      if (challenge.kind != detail::TcpFrame::kChallenge || payload.size() != detail::kTcpNonceBytes) {
        fail("fiar: TcpBootstrap rank " + std::to_string(rank()) + ": rank 0 at " + where() +
             " answered the hello with something else. Fix: make sure every rank runs the same fiar version.");
      }
      detail::TcpFrame hello;
      hello.kind = detail::TcpFrame::kHello;
      hello.rank = rank();
      hello.world = size();
      const detail::Digest256 proof = detail::tcp_proof(options_.token, payload, hello.rank, hello.world);
      detail::tcp_send_frame(root_.get(), hello, proof, deadline);
      // Rank 0 answers once the last rank has arrived: wait a little past its own deadline for its verdict.
      const detail::TcpFrame f = detail::tcp_recv_frame(root_.get(), payload, detail::kTcpMaxText, deadline + grace());
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
          const detail::TcpFrame f = detail::tcp_recv_header(p.fd, deadline);
          if (f.kind != detail::TcpFrame::kBlock || f.sequence != sequence_) {
            throw detail::TcpLost{false, "it sent collective " + std::to_string(f.sequence) + " while rank 0 is at " +
                                             std::to_string(sequence_)};
          }
          if (f.bytes != in.size()) {  // said before its bytes are read
            fail_group("fiar: all_gather block sizes differ: rank 0 gave " + std::to_string(in.size()) +
                           " bytes, rank " + std::to_string(r) + " gave " + std::to_string(f.bytes) +
                           " bytes. Fix: every rank must pass the same number of bytes to each collective.",
                       true);
          }
          detail::tcp_recv_payload(p.fd, f, blocks[r], in.size(), deadline);
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
      const detail::TcpFrame r =
          detail::tcp_recv_frame(root_.get(), payload, std::max(out.size(), detail::kTcpMaxText), deadline + grace());
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
        const detail::TcpFrame r = detail::tcp_recv_frame(root_.get(), payload, detail::kTcpMaxText,
                                                          Clock::now() + std::chrono::milliseconds(100));
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
  std::vector<detail::UniqueFd> listeners_;  // rank 0, during the rendezvous
  int dropped_ = 0;                          // rank 0: connections that did not prove themselves
  const char* last_dropped_ = "";            // why the last one was dropped
  std::vector<detail::UniqueFd> peers_;      // rank 0: the connection of each rank (index 0 unused)
  detail::UniqueFd root_;                    // other ranks: the connection to rank 0
  std::uint64_t sequence_ = 0;               // collectives this rank has entered
  std::string broken_;                       // why the group is unusable ("" while it works)
};

static_assert(Bootstrap<TcpBootstrap>);

FIAR_END_NAMESPACE
