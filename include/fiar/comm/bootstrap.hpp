// SPDX-License-Identifier: Apache-2.0
// fiar/comm/bootstrap.hpp — how the ranks of a group talk to each other on the host before any GPU collective.
// Contract: a Bootstrap knows its rank and size, all-gathers equal-sized byte blocks in rank order and
// barriers; every call is collective and bounded (a missing rank gives fiar::timeout_error, never a hang).
#pragma once

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/errors.hpp"
#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// The host-side channel of a group: rank(), size(), all_gather(in, out) where out holds size() blocks of
/// in.size() bytes in rank order, and barrier(). All ranks must call the collectives in the same order.
template <class B>
concept Bootstrap = requires(B& b, std::span<const std::byte> in, std::span<std::byte> out) {
  { b.rank() } -> std::convertible_to<int>;
  { b.size() } -> std::convertible_to<int>;
  b.all_gather(in, out);
  b.barrier();
};

/// All-gathers one trivially copyable value per rank; result[r] is rank r's value.
template <class T, Bootstrap B>
  requires std::is_trivially_copyable_v<T>
std::vector<T> all_gather_value(B& boot, const T& value) {
  std::vector<T> out(static_cast<std::size_t>(boot.size()));
  boot.all_gather(std::as_bytes(std::span<const T, 1>(&value, 1)), std::as_writable_bytes(std::span<T>(out)));
  return out;
}

namespace detail {
/// Throws std::invalid_argument (before any waiting) unless `out` holds `size` blocks of in.size() bytes: the one
/// argument check every bootstrap's all_gather makes.
inline void check_gather_output(int rank, int size, std::span<const std::byte> in, std::span<std::byte> out) {
  if (out.size() == in.size() * static_cast<std::size_t>(size)) return;
  throw std::invalid_argument(
      "fiar: all_gather on rank " + std::to_string(rank) + ": output holds " + std::to_string(out.size()) +
      " bytes; it must hold size() x input = " + std::to_string(size) + " x " + std::to_string(in.size()) + " bytes.");
}
}  // namespace detail

class InProcessBootstrap;

/// A group whose ranks are threads of one process (tests, the host emulator, one process driving
/// several GPUs). Create it once, hand bootstrap(r) to the thread of rank r; the group must outlive them.
class InProcessGroup {
 public:
  /// `timeout` bounds every collective: a rank that waits longer for its peers throws fiar::timeout_error
  /// and the group is marked broken (every later collective throws at once).
  explicit InProcessGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : size_(size), timeout_(timeout) {
    if (size < 1) {
      throw std::invalid_argument("fiar: InProcessGroup size = " + std::to_string(size) +
                                  "; allowed: 1 or more ranks. Fix: pass the number of ranks (threads) in the group.");
    }
    if (timeout.count() <= 0) {
      throw std::invalid_argument("fiar: InProcessGroup timeout = " + std::to_string(timeout.count()) +
                                  " ms; allowed: more than 0 ms. Fix: pass a positive timeout.");
    }
    pending_.resize(static_cast<std::size_t>(size));
    arrived_flag_.assign(static_cast<std::size_t>(size), false);
  }
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// The bootstrap handle of rank r (0 <= r < size()).
  [[nodiscard]] InProcessBootstrap bootstrap(int rank);

 private:
  friend class InProcessBootstrap;

  void all_gather(int rank, std::span<const std::byte> in, std::span<std::byte> out) {
    detail::check_gather_output(rank, size_, in, out);
    std::unique_lock lock(mutex_);
    if (!broken_.empty()) throw timeout_error(broken_);
    pending_[static_cast<std::size_t>(rank)].assign(in.begin(), in.end());
    arrived_flag_[static_cast<std::size_t>(rank)] = true;
    const unsigned long long my_generation = generation_;
    if (++arrived_ == size_) {
      publish_locked();
    } else {
      const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != my_generation || !broken_.empty(); });
      if (!done) break_locked(rank);
      if (generation_ == my_generation) throw timeout_error(broken_);
    }
    if (!result_error_.empty()) throw std::invalid_argument(result_error_);
    if (!out.empty()) std::memcpy(out.data(), result_.data(), out.size());
  }

  // Called by the last rank to arrive: concatenate the blocks in rank order and wake the others.
  void publish_locked() {
    result_error_.clear();
    const std::size_t block = pending_[0].size();
    for (std::size_t r = 1; r < pending_.size(); ++r) {
      if (pending_[r].size() != block) {
        result_error_ = "fiar: all_gather block sizes differ: rank 0 gave " + std::to_string(block) + " bytes, rank " +
                        std::to_string(r) + " gave " + std::to_string(pending_[r].size()) + " bytes" +
                        ". Fix: every rank must pass the same number of bytes to each collective.";
        break;
      }
    }
    result_.clear();
    if (result_error_.empty()) {
      for (const auto& p : pending_) result_.insert(result_.end(), p.begin(), p.end());
    }
    arrived_ = 0;
    arrived_flag_.assign(arrived_flag_.size(), false);
    ++generation_;
    cv_.notify_all();
  }

  void break_locked(int rank) {
    std::string missing;
    for (std::size_t r = 0; r < arrived_flag_.size(); ++r) {
      if (!arrived_flag_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    broken_ = "fiar: in-process bootstrap collective timed out after " + std::to_string(timeout_.count()) +
              " ms on rank " + std::to_string(rank) + ": " + std::to_string(arrived_) + " of " + std::to_string(size_) +
              " ranks arrived; missing rank(s): " + missing +
              ". A rank crashed, hung, or called a different collective; the group is unusable now.";
    cv_.notify_all();
  }

  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  unsigned long long generation_ = 0;
  std::vector<std::vector<std::byte>> pending_;
  std::vector<bool> arrived_flag_;
  std::vector<std::byte> result_;
  std::string result_error_;
  std::string broken_;
};

/// Rank r's handle on an InProcessGroup; satisfies Bootstrap. Cheap to copy.
class InProcessBootstrap {
 public:
  InProcessBootstrap(InProcessGroup& group, int rank) : group_(&group), rank_(rank) {
    if (rank < 0 || rank >= group.size()) {
      throw std::invalid_argument("fiar: InProcessBootstrap rank = " + std::to_string(rank) + "; allowed: 0 to " +
                                  std::to_string(group.size() - 1) + " for a group of " + std::to_string(group.size()) +
                                  " ranks.");
    }
  }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return group_->size(); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) { group_->all_gather(rank_, in, out); }
  void barrier() { group_->all_gather(rank_, {}, {}); }

 private:
  InProcessGroup* group_;
  int rank_;
};

inline InProcessBootstrap InProcessGroup::bootstrap(int rank) { return InProcessBootstrap(*this, rank); }

/// A Bootstrap held by reference behind a fixed type (the pool keeps one; the bootstrap must outlive it).
class BootstrapRef {
 public:
  template <Bootstrap B>
    requires(!std::is_same_v<std::remove_cvref_t<B>, BootstrapRef>)
  explicit BootstrapRef(B& boot)
      : rank_([&boot] { return boot.rank(); }),
        size_([&boot] { return boot.size(); }),
        all_gather_([&boot](std::span<const std::byte> in, std::span<std::byte> out) { boot.all_gather(in, out); }),
        barrier_([&boot] { boot.barrier(); }) {}

  [[nodiscard]] int rank() const { return rank_(); }
  [[nodiscard]] int size() const { return size_(); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) { all_gather_(in, out); }
  void barrier() { barrier_(); }

 private:
  std::function<int()> rank_, size_;
  std::function<void(std::span<const std::byte>, std::span<std::byte>)> all_gather_;
  std::function<void()> barrier_;
};

FIAR_END_NAMESPACE
