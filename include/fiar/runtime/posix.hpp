// SPDX-License-Identifier: Apache-2.0
// fiar/runtime/posix.hpp — thin wrappers over POSIX: file descriptors, which process and kernel a rank runs in,
// and handing file descriptors to another process over an abstract Unix socket (SCM_RIGHTS).
// Contract: every wait ends at its deadline; a failure throws detail::PosixError (errno, and whether a deadline
// passed) whose text names the call and the socket; only processes of this user (or root) receive descriptors.
// Knows nothing of fiar's protocols: callers say what the descriptors are and add their own advice.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../core/prelude.hpp"
#include "../core/text.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// A failed POSIX call or an expired wait: `error` is the errno (0 for a timeout), `timed_out` says which.
class PosixError : public std::runtime_error {
 public:
  PosixError(const std::string& what, int error, bool timed_out)
      : std::runtime_error(what), error_(error), timed_out_(timed_out) {}
  [[nodiscard]] int error() const noexcept { return error_; }
  [[nodiscard]] bool timed_out() const noexcept { return timed_out_; }

 private:
  int error_;
  bool timed_out_;
};

/// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~UniqueFd() {
    if (fd_ >= 0) (void)::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// The first line of a file ("" when it cannot be read).
inline std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

/// Which process a rank runs in. A pid alone is ambiguous: two containers on one machine can each have a process
/// with the same pid, so the pid namespace and the kernel's boot id are part of it.
struct ProcessIdentity {
  std::int64_t pid = 0;
  std::uint64_t pid_namespace = 0;
  std::uint64_t boot = 0;  ///< fnv1a of the kernel's boot id: equal for processes under one kernel
  friend bool operator==(const ProcessIdentity&, const ProcessIdentity&) = default;
};

inline ProcessIdentity this_process() {
  ProcessIdentity id;
  id.pid = static_cast<std::int64_t>(::getpid());
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) id.pid_namespace = static_cast<std::uint64_t>(ns.st_ino);
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  if (!boot.empty()) id.boot = fnv1a(boot);
  return id;
}

/// An identifier nobody else on the machine is likely to pick (names sockets and registry entries).
inline std::uint64_t random_id() {
  std::uint64_t id = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  id ^= static_cast<std::uint64_t>(::getpid()) << 40;
  try {
    std::random_device device;
    id ^= (static_cast<std::uint64_t>(device()) << 32) ^ device();
  } catch (const std::exception&) {
    // no entropy source: time and pid only
  }
  id ^= id >> 33;
  id *= 0xff51afd7ed558ccdull;
  id ^= id >> 33;
  return id;
}

using Deadline = std::chrono::steady_clock::time_point;

inline int remaining_ms(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
}

/// An abstract AF_UNIX socket address (no file; gone with the socket) for `name`.
inline socklen_t abstract_address(const std::string& name, sockaddr_un& address) {
  address = sockaddr_un{};
  address.sun_family = AF_UNIX;
  address.sun_path[0] = '\0';
  const std::size_t n = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

[[noreturn]] inline void throw_errno(const std::string& call, const std::string& socket, int error) {
  throw PosixError("fiar: " + call + " on the Unix socket @" + socket + " failed: " + std::strerror(error) +
                       " (errno " + std::to_string(error) + ")",
                   error, false);
}

/// What travels with the descriptors: who sends them and how many.
struct FdHeader {
  std::uint32_t magic;
  std::int32_t sender;
  std::uint64_t tag;
  std::uint32_t fd_count;
  std::uint32_t reserved;
};
inline constexpr std::uint32_t kFdMagic = 0x6669614du;  // "fiaM"
inline constexpr std::size_t kMaxPassedFds = 4;

/// The one message layout both sides use: the header in one iovec, up to kMaxPassedFds descriptors as SCM_RIGHTS.
struct FdMessage {
  FdHeader header{};
  iovec iov{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  explicit FdMessage(std::size_t fds) {
    iov = iovec{&header, sizeof(header)};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = fds == 0 ? sizeof(control) : CMSG_SPACE(sizeof(int) * fds);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

/// The listening socket @name, created before the peers look for it.
inline UniqueFd listen_abstract(const std::string& name, int backlog) {
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) throw_errno("socket(AF_UNIX, SOCK_SEQPACKET)", name, errno);
  sockaddr_un address{};
  const socklen_t length = abstract_address(name, address);
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) throw_errno("bind", name, errno);
  if (::listen(s.get(), std::max(backlog, 1)) != 0) throw_errno("listen", name, errno);
  return s;
}

/// Hands `fds` (with `tag` and `sender` in the header) to `clients` connections on `listener` (socket @name), one
/// message each; throws PosixError (timed_out) when the deadline passes first.
inline void serve_fds(int listener, const std::string& name, std::uint64_t tag, int sender, std::span<const int> fds,
                      int clients, Deadline deadline) {
  int served = 0;
  while (served < clients) {
    const int left = remaining_ms(deadline);
    if (left == 0) {
      throw PosixError("fiar: rank " + std::to_string(sender) + " handed its descriptors to only " +
                           std::to_string(served) + " of " + std::to_string(clients) +
                           " peer processes before the deadline (socket @" + name + ")",
                       0, true);
    }
    pollfd p{listener, POLLIN, 0};
    const int ready = ::poll(&p, 1, std::min(left, 100));
    if (ready < 0 && errno != EINTR) throw_errno("poll", name, errno);
    if (ready <= 0) continue;
    UniqueFd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      throw_errno("accept4", name, errno);
    }
    ucred peer{};
    socklen_t peer_length = sizeof(peer);
    if (::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &peer, &peer_length) != 0 ||
        (peer.uid != ::geteuid() && peer.uid != 0)) {
      continue;  // only processes of this user (or root) get this process's descriptors
    }
    FdMessage m(fds.size());
    m.header = FdHeader{kFdMagic, sender, tag, static_cast<std::uint32_t>(fds.size()), 0};
    cmsghdr* h = CMSG_FIRSTHDR(&m.msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
    if (::sendmsg(c.get(), &m.msg, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(FdHeader)))
      throw_errno("sendmsg(SCM_RIGHTS)", name, errno);
    ++served;
  }
}

/// Connects to socket @name (retrying until it exists) and receives, for rank `me`, `expected` descriptors sent by rank
/// `sender` with `tag`; throws PosixError (timed_out) when the deadline passes first.
inline std::vector<UniqueFd> receive_fds(const std::string& name, std::uint64_t tag, int sender, int me,
                                         std::size_t expected, Deadline deadline) {
  const auto timed_out = [&](const char* stage) {
    return PosixError("fiar: rank " + std::to_string(me) + " got no descriptors from rank " + std::to_string(sender) +
                          " on the Unix socket @" + name + " before the deadline (" + stage + ")",
                      0, true);
  };
  sockaddr_un address{};
  const socklen_t length = abstract_address(name, address);
  UniqueFd s;
  for (;;) {
    s = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) throw_errno("socket(AF_UNIX, SOCK_SEQPACKET)", name, errno);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0) break;
    const int error = errno;
    if (error != ECONNREFUSED && error != ENOENT && error != EAGAIN && error != EINTR)
      throw_errno("connect", name, error);
    if (remaining_ms(deadline) == 0) throw timed_out("connecting");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (;;) {
    const int left = remaining_ms(deadline);
    if (left == 0) throw timed_out("connected, waiting for the message");
    pollfd p{s.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, left);
    if (ready > 0) break;
    if (ready < 0 && errno != EINTR) throw_errno("poll", name, errno);
  }
  FdMessage m(0);
  const ssize_t got = ::recvmsg(s.get(), &m.msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (got < 0) throw_errno("recvmsg(SCM_RIGHTS)", name, errno);
  std::vector<UniqueFd> fds;  // owned at once, so that they are closed on every error below
  for (cmsghdr* h = CMSG_FIRSTHDR(&m.msg); h != nullptr; h = CMSG_NXTHDR(&m.msg, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  const FdHeader& hd = m.header;
  if (got != static_cast<ssize_t>(sizeof(FdHeader)) || (m.msg.msg_flags & MSG_CTRUNC) != 0 || hd.magic != kFdMagic ||
      hd.tag != tag || hd.sender != sender || hd.fd_count != expected || fds.size() != expected) {
    throw PosixError("fiar: an unexpected message arrived on the Unix socket @" + name + ": " + std::to_string(got) +
                         " bytes and " + std::to_string(fds.size()) + " descriptors, where rank " +
                         std::to_string(sender) + " sends " + std::to_string(sizeof(FdHeader)) + " bytes and " +
                         std::to_string(expected) +
                         " descriptors (the peer closed early, or another program uses "
                         "this socket name)",
                     EPROTO, false);
  }
  return fds;
}

// ---- POSIX shared memory (the host emulator's memory when its ranks are processes) ----

/// The prefix of the shared-memory segments the host emulator creates: "fiar-host-<pid>-<id>" under /dev/shm.
inline constexpr const char* kHostSegmentPrefix = "fiar-host-";

/// A mapping of a whole segment, unmapped when the last owner lets go (the segment's name may be gone long before).
inline std::shared_ptr<std::uint32_t> map_segment(int fd, std::size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw PosixError("fiar: mmap of the shared-memory segment " + name + " (" + std::to_string(bytes) +
                         " bytes) failed: " + std::strerror(errno),
                     errno, false);
  }
  return std::shared_ptr<std::uint32_t>(static_cast<std::uint32_t*>(p),
                                        [bytes](std::uint32_t* q) { (void)::munmap(q, bytes); });
}

/// Creates segment `name` ("/..."), `bytes` long and zero-filled, readable and writable by this user only, and maps
/// it. The caller unlinks the name once every peer has mapped it.
inline std::shared_ptr<std::uint32_t> create_segment(const std::string& name, std::size_t bytes) {
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    throw PosixError("fiar: shm_open(O_CREAT) of the shared-memory segment " + name +
                         " failed: " + std::strerror(errno) + " (is /dev/shm mounted and writable?)",
                     errno, false);
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    (void)::shm_unlink(name.c_str());
    throw PosixError("fiar: ftruncate of the shared-memory segment " + name + " to " + std::to_string(bytes) +
                         " bytes failed: " + std::strerror(error) + " (is /dev/shm full?)",
                     error, false);
  }
  try {
    return map_segment(fd.get(), bytes, name);
  } catch (...) {
    (void)::shm_unlink(name.c_str());
    throw;
  }
}

/// Maps the existing segment `name`, which must be at least `bytes` long.
inline std::shared_ptr<std::uint32_t> open_segment(const std::string& name, std::size_t bytes) {
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    throw PosixError("fiar: shm_open of the shared-memory segment " + name + " failed: " + std::strerror(errno) +
                         " (do the ranks share one machine and one /dev/shm?)",
                     errno, false);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    throw PosixError("fiar: the shared-memory segment " + name + " holds " + std::to_string(st.st_size) +
                         " bytes, fewer than the " + std::to_string(bytes) + " this rank expects",
                     EPROTO, false);
  }
  return map_segment(fd.get(), bytes, name);
}

/// The start of the names of this boot's and this pid namespace's segments: "fiar-host-<boot>-<pid namespace>-".
inline std::string host_segment_namespace(const ProcessIdentity& me) {
  return std::string(kHostSegmentPrefix) + std::to_string(me.boot % 1000000007u) + "-" +
         std::to_string(me.pid_namespace) + "-";
}

/// The name of a segment this process creates: "/fiar-host-<boot>-<pid namespace>-<pid>-<random>", with the
/// kernel's boot id (hashed) and the pid namespace, so that a sweep in another container (another pid namespace
/// over one /dev/shm) can tell the segment is not its own.
inline std::string host_segment_name(std::uint64_t random) {
  const ProcessIdentity me = this_process();
  return "/" + host_segment_namespace(me) + std::to_string(me.pid) + "-" + std::to_string(random);
}

/// Whether `name` (received from a peer, in a buffer of `capacity` bytes) is a segment name the host emulator makes:
/// terminated within the buffer, fiar's prefix, digits and dashes after it.
inline bool is_host_segment_name(const char* name, std::size_t capacity) {
  const std::size_t n = ::strnlen(name, capacity);
  const std::string_view prefix = kHostSegmentPrefix;
  const std::string_view text(name, n);
  if (n == capacity || n < prefix.size() + 2 || text[0] != '/' || text.substr(1, prefix.size()) != prefix) return false;
  return text.substr(1 + prefix.size()).find_first_not_of("0123456789-") == std::string_view::npos;
}

/// Removes the host emulator's segments of this user that a process now gone left behind (it was killed between
/// creating a segment and the group's agreement, the only window in which a name exists): only segments created
/// under this kernel boot and in this pid namespace, whose creator no longer exists. Another namespace's segments
/// (another container sharing /dev/shm) are never touched: its pids mean nothing here.
inline void remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string mine = host_segment_namespace(this_process());
  while (const dirent* e = ::readdir(dir)) {
    const std::string entry = e->d_name;
    if (entry.rfind(mine, 0) != 0) continue;
    const long pid = std::strtol(entry.c_str() + mine.size(), nullptr, 10);
    struct stat st {};
    if (pid <= 0 || ::stat(("/dev/shm/" + entry).c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) (void)::shm_unlink(("/" + entry).c_str());
  }
  ::closedir(dir);
}

}  // namespace detail
FIAR_END_NAMESPACE
