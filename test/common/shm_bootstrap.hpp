// SPDX-License-Identifier: Apache-2.0
// Test-only: a fiar::Bootstrap whose ranks are separate processes on one machine, talking through a POSIX
// shared-memory segment (shm_open + mmap). A parent creates the segment (ShmSegment) before it starts the
// rank processes; each rank opens it by name (ShmBootstrap).
//
// Protocol: a sense-reversing barrier on lock-free std::atomic<uint32_t> in the segment (lock-free atomics
// work across processes that map the same memory), and all_gather = write my block into
// slot[generation % 2][rank], barrier, read every rank's slot of that generation. Two slot sets suffice: a
// rank can only overwrite slot set g % 2 again at generation g + 2, after the barrier of generation g + 1,
// which every rank reaches only once it has finished reading generation g.
//
// Every wait is bounded: a rank that waits longer than the timeout throws fiar::timeout_error naming the
// ranks that never arrived and marks the group broken, so every later (and every waiting) collective of
// every rank throws at once instead of waiting out its own timeout.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fiar/fiar.hpp>

namespace fiar_test {

inline constexpr int kShmMaxRanks = 16;
inline constexpr std::size_t kShmMaxBlock = 4096;  ///< largest all_gather block per rank

static_assert(std::atomic<std::uint32_t>::is_always_lock_free,
              "cross-process atomics in shared memory need lock-free std::atomic<uint32_t>");

namespace shm_detail {

inline constexpr std::uint32_t kMagic = 0x66695348;  // "fiSH"

struct Slot {
  std::uint64_t bytes;  ///< the size the owner passed (may exceed kShmMaxBlock: then nothing was copied)
  alignas(64) std::byte data[kShmMaxBlock];
};

/// The segment. Zero-filled by ftruncate, then constructed once by the parent.
struct Layout {
  std::uint32_t magic;
  std::uint32_t world;
  std::atomic<std::uint32_t> broken;                 ///< 0, or 1 + the rank that gave up first
  alignas(64) std::atomic<std::uint32_t> count;      ///< arrivals at the current barrier
  alignas(64) std::atomic<std::uint32_t> sense;      ///< flips each time every rank has arrived
  std::atomic<std::uint32_t> entered[kShmMaxRanks];  ///< barriers each rank has entered (for diagnostics)
  Slot slots[2][kShmMaxRanks];
};

inline std::string errno_text(const std::string& call) { return call + ": " + std::strerror(errno); }

inline Layout* map_segment(int fd, const std::string& name) {
  void* p = ::mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int saved = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    errno = saved;
    throw std::runtime_error(errno_text("mmap of shared-memory segment '" + name + "'"));
  }
  return static_cast<Layout*>(p);
}

}  // namespace shm_detail

/// Owns the segment: creates and initialises it, and unlinks it when destroyed. `name` starts with '/'.
class ShmSegment {
 public:
  ShmSegment(std::string name, int world) : name_(std::move(name)) {
    if (world < 1 || world > kShmMaxRanks) {
      throw std::invalid_argument("ShmSegment: world size " + std::to_string(world) + "; allowed: 1 to " +
                                  std::to_string(kShmMaxRanks));
    }
    const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw std::runtime_error(shm_detail::errno_text("shm_open(O_CREAT|O_EXCL) of '" + name_ + "'"));
    if (::ftruncate(fd, static_cast<off_t>(sizeof(shm_detail::Layout))) != 0) {
      const std::string what = shm_detail::errno_text("ftruncate of shared-memory segment '" + name_ + "'");
      ::close(fd);
      ::shm_unlink(name_.c_str());
      throw std::runtime_error(what);
    }
    try {
      layout_ = shm_detail::map_segment(fd, name_);
    } catch (...) {
      ::shm_unlink(name_.c_str());
      throw;
    }
    new (layout_) shm_detail::Layout{};
    layout_->world = static_cast<std::uint32_t>(world);
    layout_->magic = shm_detail::kMagic;  // rank processes start after this: no ordering needed
  }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment() {
    ::munmap(layout_, sizeof(shm_detail::Layout));
    ::shm_unlink(name_.c_str());
  }

  [[nodiscard]] const std::string& name() const { return name_; }

 private:
  std::string name_;
  shm_detail::Layout* layout_ = nullptr;
};

/// Rank `rank` of the group in the segment `name`; satisfies fiar::Bootstrap.
class ShmBootstrap {
 public:
  ShmBootstrap(const std::string& name, int rank, int world,
               std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : rank_(rank), world_(world), timeout_(timeout) {
    if (world < 1 || world > kShmMaxRanks || rank < 0 || rank >= world) {
      throw std::invalid_argument("ShmBootstrap: rank " + std::to_string(rank) + " of world " + std::to_string(world) +
                                  "; allowed: 0 <= rank < world <= " + std::to_string(kShmMaxRanks));
    }
    if (timeout.count() <= 0) throw std::invalid_argument("ShmBootstrap: the timeout must be positive");
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) throw std::runtime_error(shm_detail::errno_text("shm_open of '" + name + "'"));
    layout_ = shm_detail::map_segment(fd, name);
    if (layout_->magic != shm_detail::kMagic || layout_->world != static_cast<std::uint32_t>(world)) {
      const std::uint32_t seg_world = layout_->world;
      ::munmap(layout_, sizeof(shm_detail::Layout));
      throw std::invalid_argument("ShmBootstrap: segment '" + name + "' is not a ShmSegment of world " +
                                  std::to_string(world) + " (it says world " + std::to_string(seg_world) + ")");
    }
  }
  ShmBootstrap(const ShmBootstrap&) = delete;
  ShmBootstrap& operator=(const ShmBootstrap&) = delete;
  ~ShmBootstrap() { ::munmap(layout_, sizeof(shm_detail::Layout)); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return world_; }

  void barrier() { arrive_and_wait(); }

  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    if (out.size() != in.size() * static_cast<std::size_t>(world_)) {
      throw std::invalid_argument("ShmBootstrap::all_gather on rank " + std::to_string(rank_) + ": output holds " +
                                  std::to_string(out.size()) + " bytes; it must hold size() x input = " +
                                  std::to_string(world_) + " x " + std::to_string(in.size()) + " bytes");
    }
    auto* slots = layout_->slots[generation_++ % 2];
    // A block that is too large is still announced, so that every rank throws the same error together.
    slots[rank_].bytes = in.size();
    if (in.size() <= kShmMaxBlock && !in.empty()) std::memcpy(slots[rank_].data, in.data(), in.size());
    arrive_and_wait();
    // Every rank sees the same sizes, so every rank throws the same error (and stays in step).
    for (int r = 0; r < world_; ++r) {
      if (slots[r].bytes > kShmMaxBlock) {
        throw std::invalid_argument("ShmBootstrap::all_gather: rank " + std::to_string(r) + " passed " +
                                    std::to_string(slots[r].bytes) + " bytes; allowed: at most " +
                                    std::to_string(kShmMaxBlock) + " per rank");
      }
    }
    for (int r = 1; r < world_; ++r) {
      if (slots[r].bytes != slots[0].bytes) {
        throw std::invalid_argument("ShmBootstrap::all_gather: block sizes differ: rank 0 passed " +
                                    std::to_string(slots[0].bytes) + " bytes, rank " + std::to_string(r) + " passed " +
                                    std::to_string(slots[r].bytes));
      }
    }
    for (int r = 0; r < world_; ++r) {
      if (!in.empty()) std::memcpy(out.data() + static_cast<std::size_t>(r) * in.size(), slots[r].data, in.size());
    }
  }

  /// Marks the group broken (this rank is leaving after a failure): every peer's current and later
  /// collectives throw fiar::timeout_error at once instead of waiting for this rank.
  void abandon() noexcept {
    std::uint32_t expected = 0;
    layout_->broken.compare_exchange_strong(expected, static_cast<std::uint32_t>(rank_) + 1);
  }

 private:
  [[noreturn]] void throw_broken() const {
    const std::uint32_t who = layout_->broken.load(std::memory_order_acquire) - 1;
    throw fiar::timeout_error("ShmBootstrap on rank " + std::to_string(rank_) + ": the group is broken: rank " +
                              std::to_string(who) + " gave up (timed out or failed) before this collective finished");
  }

  void arrive_and_wait() {
    auto& s = *layout_;
    if (s.broken.load(std::memory_order_acquire) != 0) throw_broken();
    ++barriers_;
    sense_ ^= 1u;
    s.entered[rank_].store(barriers_, std::memory_order_relaxed);
    // acq_rel: the last arrival acquires every earlier arrival's writes (slots included) through the
    // read-modify-write chain on `count`, then releases them all with the store to `sense`.
    if (s.count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(world_)) {
      s.count.store(0, std::memory_order_relaxed);  // ordered before the release below
      s.sense.store(sense_, std::memory_order_release);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned spin = 0; s.sense.load(std::memory_order_acquire) != sense_; ++spin) {
      if (s.broken.load(std::memory_order_acquire) != 0) throw_broken();
      if (spin < 64) {
        std::this_thread::yield();
        continue;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abandon();
        std::string missing;
        for (int r = 0; r < world_; ++r) {
          if (s.entered[r].load(std::memory_order_relaxed) < barriers_) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
        }
        throw fiar::timeout_error("ShmBootstrap collective timed out after " + std::to_string(timeout_.count()) +
                                  " ms on rank " + std::to_string(rank_) + " (collective " + std::to_string(barriers_) +
                                  "): missing rank(s): " + missing + "; the group is broken now");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  shm_detail::Layout* layout_ = nullptr;
  std::uint32_t sense_ = 0;       ///< this rank's sense: the value `sense` takes when the current barrier completes
  std::uint32_t barriers_ = 0;    ///< barriers this rank has entered
  std::uint64_t generation_ = 0;  ///< all_gathers this rank has entered
};

static_assert(fiar::Bootstrap<ShmBootstrap>);

/// A unique segment name for this process: "/fiar-<tag>-<pid>-<counter>".
inline std::string unique_shm_name(const std::string& tag) {
  static std::atomic<unsigned> counter{0};
  return "/fiar-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

inline constexpr int kChildKilled = -1;      ///< wait_children: still running at the deadline, killed
inline constexpr int kChildWaitFailed = -2;  ///< wait_children: waitpid failed (not our child?)

/// Waits for every child; kills (SIGKILL) those still running at the deadline. Returns each child's
/// wait status (see WIFEXITED / WEXITSTATUS), kChildKilled or kChildWaitFailed.
inline std::vector<int> wait_children(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  std::vector<int> status(pids.size(), kChildKilled);
  std::vector<bool> done(pids.size(), false);
  std::size_t left = pids.size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      const pid_t r = ::waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i] || (r < 0 && errno != EINTR)) {
        status[i] = r == pids[i] ? st : kChildWaitFailed;
        done[i] = true;
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    ::kill(pids[i], SIGKILL);
    int st = 0;
    while (::waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
    }
  }
  return status;
}

/// "exit 0", "exit 1", "killed by signal 9", "killed at the deadline", ...
inline std::string describe_wait_status(int st) {
  if (st == kChildKilled) return "still running at the deadline: killed";
  if (st == kChildWaitFailed) return "waitpid failed";
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "killed by signal " + std::to_string(WTERMSIG(st));
  return "wait status " + std::to_string(st);
}

}  // namespace fiar_test
