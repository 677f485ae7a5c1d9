// SPDX-License-Identifier: Apache-2.0
// fiar/backend/streams.hpp — which stream each rank of a group calls on, known across the ranks of one process, so
// that two ranks on one stream get an error instead of a hang.
// Contract: a workspace claims the stream of each call (cheap when it is the last one's); a claim of a stream another
// rank of the same group (same group id, agreed at creation) holds throws std::invalid_argument naming both ranks and
// the stream; a claim ends when its workspace moves to another stream or is destroyed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

class StreamClaim {
 public:
  StreamClaim() = default;
  StreamClaim(std::uint64_t group, int rank) : group_(group), rank_(rank), id_(next_id()) {}
  StreamClaim(StreamClaim&& other) noexcept
      : group_(other.group_), rank_(other.rank_), id_(std::exchange(other.id_, 0)), key_(other.key_) {}
  StreamClaim& operator=(StreamClaim&&) = delete;
  ~StreamClaim() { release(); }

  /// Claims the stream `key` (the platform's stream_key: equal for two ranks exactly when they share the stream) for
  /// this rank. Throws std::invalid_argument when another rank of the group holds it: both ranks' kernels would then
  /// queue on one stream, the first waiting for data the second can only send once the first has finished.
  void claim(std::uintptr_t key) {
    if (key == key_ || id_ == 0 || key == 0) return;
    std::lock_guard lock(mutex());
    auto& holders = table()[key];
    for (const Holder& h : holders) {
      if (h.group == group_ && h.id != id_) {
        throw std::invalid_argument(
            "fiar: rank " + std::to_string(rank_) + " calls on stream " + describe(key) + ", which rank " +
            std::to_string(h.rank) +
            " of the same workspace group calls on too; two ranks on one stream cannot both make progress (the first "
            "rank's kernel waits for data the second rank's kernel, queued behind it, would send). Fix: give each "
            "rank a stream of its own (CUDA: cudaStreamCreate per rank thread; torch: a torch.cuda.Stream per rank "
            "thread; not the default stream of one GPU shared by several ranks).");
      }
    }
    drop_locked();
    table()[key].push_back(Holder{group_, rank_, id_});
    key_ = key;
  }

 private:
  struct Holder {
    std::uint64_t group;
    int rank;
    std::uint64_t id;
  };
  static std::string describe(std::uintptr_t key) {
    if ((key & 1u) != 0) return "nullptr (the default stream of its device)";
    char text[32];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(key));
    return text;
  }
  void release() {
    if (id_ == 0 || key_ == 0) return;
    std::lock_guard lock(mutex());
    drop_locked();
  }
  void drop_locked() {
    if (key_ == 0) return;
    auto it = table().find(key_);
    if (it != table().end()) {
      auto& v = it->second;
      std::erase_if(v, [&](const Holder& h) { return h.id == id_; });
      if (v.empty()) table().erase(it);
    }
    key_ = 0;
  }
  static std::uint64_t next_id() {
    static std::uint64_t n = 0;
    std::lock_guard lock(mutex());
    return ++n;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::uintptr_t, std::vector<Holder>>& table() {
    static std::map<std::uintptr_t, std::vector<Holder>> t;
    return t;
  }

  std::uint64_t group_ = 0;
  int rank_ = 0;
  std::uint64_t id_ = 0;  ///< 0: moved from, or no group
  std::uintptr_t key_ = 0;
};

}  // namespace detail
FIAR_END_NAMESPACE
