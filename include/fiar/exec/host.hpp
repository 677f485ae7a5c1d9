// SPDX-License-Identifier: Apache-2.0
// fiar/exec/host.hpp — the host emulator: runs any operation's logic on the CPU, one thread per lane, a barrier per
// block and one per cluster of blocks.
// Contract: HostGrid keeps its lane threads alive across launches; run() returns when every lane has finished;
// HostCtx gives the algo code the same operations DeviceCtx gives it on the GPU (ExecutionContext).
#pragma once

#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../core/prelude.hpp"
#include "atomics.hpp"
#include "context.hpp"
#include "vec.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// The memory spaces a GPU kernel of fiar reaches, as the emulator tells them apart (HostPlatform registers every
/// allocation): this rank's device memory (protocol state, its own Lamport buffers), a peer's memory through its
/// mapping, the group's multicast mapping (stores, load-reduces and adds through the view), host-visible memory
/// (pinned host memory on a GPU: the error records), and everything else (the caller's tensors).
enum class Space : int { Device, Peer, Multicast, HostVisible, Other };
inline constexpr int kSpaces = 5;

/// Per-space counts of the memory accesses of a platform's kernels (each 32-bit or 16-byte access counts one), for
/// tests that hold the kernels to where they may reach: e.g. no host-visible access while a healthy call waits.
/// Ranges are registered before any launch that could touch them, and read concurrently by the lanes.
class AccessCounter {
 public:
  void add_range(const void* begin, std::size_t bytes, Space space) {
    const auto b = reinterpret_cast<std::uintptr_t>(begin);
    ranges_.push_back(Range{b, b + bytes, space});
  }
  [[nodiscard]] Space space_of(const void* p) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (const Range& r : ranges_) {
      if (a >= r.begin && a < r.end) return r.space;
    }
    return Space::Other;
  }
  void count(const void* p) { count(space_of(p)); }
  void count(Space s) { counts_[static_cast<int>(s)].fetch_add(1, std::memory_order_relaxed); }
  /// Accesses counted so far in space s.
  [[nodiscard]] std::uint64_t operator[](Space s) const {
    return counts_[static_cast<int>(s)].load(std::memory_order_relaxed);
  }

 private:
  struct Range {
    std::uintptr_t begin, end;
    Space space;
  };
  std::vector<Range> ranges_;
  std::atomic<std::uint64_t> counts_[kSpaces] = {};
};

/// The execution context of one emulated lane.
class HostCtx : public SystemAtomics {
 public:
  HostCtx(int lane, int lanes, int block, int blocks, std::barrier<>* block_barrier, float* block_scratch,
          int cluster_size = 1, std::barrier<>* cluster_barrier = nullptr, float* cluster_scratch = nullptr,
          float* token_scratch = nullptr, float* group_scratch = nullptr, AccessCounter* counter = nullptr)
      : counter_(counter),
        lane_(lane),
        lanes_(lanes),
        block_(block),
        blocks_(blocks),
        cluster_size_(cluster_size),
        barrier_(block_barrier),
        cluster_barrier_(cluster_barrier),
        scratch_(block_scratch),
        cluster_scratch_(cluster_scratch),
        token_scratch_(token_scratch),
        group_scratch_(group_scratch) {}

  [[nodiscard]] int lane() const { return lane_; }
  [[nodiscard]] int lanes() const { return lanes_; }
  [[nodiscard]] int block() const { return block_; }
  [[nodiscard]] int blocks() const { return blocks_; }

  /// __syncthreads(): every lane of the block.
  void sync() { barrier_->arrive_and_wait(); }

  /// __syncthreads_or(): every lane of the block; true when any lane voted true.
  bool sync_or(bool vote) { return sum(vote ? 1.0f : 0.0f) != 0.0f; }

  /// Every lane of every block of the cluster.
  void cluster_sync() {
    if (cluster_size_ == 1) {
      sync();
    } else {
      cluster_barrier_->arrive_and_wait();
    }
  }

  /// A token's canonical sum (exec::canonical_token_sum), as on the GPU but with any grid: every lane hands the value
  /// of each vector it owns (a vector past the token's end is ignored); token_sum(vecs) then computes the canonical
  /// total from the cluster's values on every lane (the same bits as the GPU's shuffles, whatever the launch shape).
  void token_sum_add(int vec, float q) {
    if (vec >= 0 && vec < kMaxTokenVecs) token_scratch_[vec] = q;
  }
  float token_sum(int vecs) {
    cluster_sync();
    const float total = canonical_token_sum(token_scratch_, vecs);
    cluster_sync();  // nobody overwrites a value (the next token's) before every lane has read them all
    return total;
  }

  /// The largest value of a group of `group_vecs` consecutive vectors of a token (the group of `vec`, which starts at
  /// a multiple of group_vecs), as on the GPU but with any grid: every lane hands each vector's value it owns
  /// (group_max_add), every lane of the cluster then passes the barrier group_max_sync, and group_max reads the
  /// group's values back (`x`, the lane's own value, is what the GPU's shuffles use; here it is already recorded).
  /// The next token's group_max_add follows a cluster barrier (its token_sum), so no value is overwritten while read.
  void group_max_add(int vec, float x) {
    if (vec >= 0 && vec < kMaxTokenVecs) group_scratch_[vec] = x;
  }
  void group_max_sync() { cluster_sync(); }
  float group_max(int vec, float /*x*/, int group_vecs) {
    if (vec < 0 || group_vecs < 1) return 0.0f;
    const int first = vec / group_vecs * group_vecs;
    float m = 0.0f;
    for (int v = first; v < first + group_vecs && v < kMaxTokenVecs; ++v)
      m = m > group_scratch_[v] ? m : group_scratch_[v];
    return m;
  }

  /// Block-wide sum and max, deterministic: every lane gets the lanes' values combined in lane order.
  /// Every lane of the block must call them.
  float sum(float x) {
    return reduce(x, [](float a, float b) { return a + b; });
  }
  float max(float x) {
    return reduce(x, [](float a, float b) { return a > b ? a : b; });
  }

  /// This block's rank in its cluster (clusters are runs of cluster_size() consecutive blocks), and that size.
  [[nodiscard]] int cluster_rank() const { return block_ % cluster_size_; }
  [[nodiscard]] int cluster_size() const { return cluster_size_; }
  /// This block's cluster in the grid, and the grid's clusters.
  [[nodiscard]] int cluster_index() const { return block_ / cluster_size_; }
  [[nodiscard]] int clusters() const { return blocks_ / cluster_size_; }

  /// Cluster-wide sum and max (distributed shared memory on the GPU): each block's own sum, then the blocks' results
  /// combined in cluster-rank order, the same on every lane of the cluster. Every lane of the cluster must call them.
  float cluster_sum(float x) {
    return cluster_reduce(sum(x), [](float a, float b) { return a + b; });
  }
  float cluster_max(float x) {
    return cluster_reduce(max(x), [](float a, float b) { return a > b ? a : b; });
  }

  /// A wait's check (failure word and clock: algo::kSpinsPerCheck) at every spin here: each spin yields the CPU, which
  /// on a loaded machine costs milliseconds.
  static constexpr std::uint32_t kSpinsPerCheck = 1;

  static std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  static void pause() { std::this_thread::yield(); }

  /// A full fence, expressed as a seq_cst read-modify-write (ThreadSanitizer does not model
  /// atomic_thread_fence; an RMW gives the same ordering and is visible to it).
  static void fence_system() {
    static std::atomic<std::uint32_t> fence_word{0};
    fence_word.fetch_add(1, std::memory_order_seq_cst);
  }

  /// 16-byte access to memory other ranks touch concurrently: four 32-bit atomics (on the GPU, one volatile vector
  /// access; either way each 32-bit word is single-copy atomic, which is all the Lamport protocol relies on). Release
  /// stores and acquire loads here: on the GPU a lane that reads a Lamport word and then writes memory another lane
  /// read before pushing that word (an in-place call: the push reads `in`, the epilogue writes `out` == `in`) is
  /// ordered by the data dependency; C++ has no such order, so the emulator states it and ThreadSanitizer checks it.
  Vec16 load16(const std::uint32_t* p) {
    count(p);
    return raw_load16(p);
  }
  void store16(std::uint32_t* p, const Vec16& v) {
    count(p);
    raw_store16(p, v);
  }
  /// The clear's store (weak on the GPU; relaxed atomics here, since peers' pushes may follow without a lock).
  void store16_weak(std::uint32_t* p, const Vec16& v) {
    count(p);
    SystemAtomics::store_relaxed(p, v.x);
    SystemAtomics::store_relaxed(p + 1, v.y);
    SystemAtomics::store_relaxed(p + 2, v.z);
    SystemAtomics::store_relaxed(p + 3, v.w);
  }

  /// The 32-bit system-scope atomics (SystemAtomics), counted by space when the platform counts accesses.
  std::uint32_t load_relaxed(const std::uint32_t* p) {
    count(p);
    return SystemAtomics::load_relaxed(p);
  }
  std::uint32_t load_acquire(const std::uint32_t* p) {
    count(p);
    return SystemAtomics::load_acquire(p);
  }
  void store_relaxed(std::uint32_t* p, std::uint32_t v) {
    count(p);
    SystemAtomics::store_relaxed(p, v);
  }
  void store_release(std::uint32_t* p, std::uint32_t v) {
    count(p);
    SystemAtomics::store_release(p, v);
  }
  std::uint32_t fetch_add_acq_rel(std::uint32_t* p, std::uint32_t v) {
    count(p);
    return SystemAtomics::fetch_add_acq_rel(p, v);
  }
  std::uint32_t fetch_add_relaxed(std::uint32_t* p, std::uint32_t v) {
    count(p);
    return SystemAtomics::fetch_add_relaxed(p, v);
  }
  std::uint32_t fetch_or_relaxed(std::uint32_t* p, std::uint32_t v) {
    count(p);
    return SystemAtomics::fetch_or_relaxed(p, v);
  }

  /// A store through the group's multicast mapping: the emulator plays the NVSwitch and writes v at
  /// `offset` into every member's region (on the GPU, one multimem.st the switch replicates). Like the
  /// switch, it gives no order between members; each word is still single-copy atomic.
  void multicast_store16(const MulticastView& view, std::size_t offset, const Vec16& v) {
    count(Space::Multicast);
    for (int m = 0; m < view.member_count; ++m) raw_store16(view.members[m] + offset, v);
    if (view.stores != nullptr) SystemAtomics::fetch_add_acq_rel(view.stores, 1u);
  }

  /// A load-reduce through the multicast mapping: the members' 16 bytes at `offset`, summed element by element in
  /// fp32 in member (rank) order and rounded once to the element type (on the GPU the switch sums them, in an order
  /// it does not specify; multimem.ld_reduce with fp32 accumulation for 16-bit types).
  Vec16 multicast_ld_reduce16(const MulticastView& view, std::size_t offset, ReduceKind kind) {
    count(Space::Multicast);
    float acc[8] = {};
    for (int m = 0; m < view.member_count; ++m) {
      const Vec16 v = raw_load16(view.members[m] + offset);
      const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
      for (int i = 0; i < 4; ++i) {
        if (kind == ReduceKind::F32) {
          acc[i] += std::bit_cast<float>(w[i]);
        } else {
          for (int h = 0; h < 2; ++h) {
            const auto bits = static_cast<std::uint16_t>(w[i] >> (16 * h));
            acc[2 * i + h] += kind == ReduceKind::F16 ? __half2float(std::bit_cast<__half>(bits))
                                                      : __bfloat162float(std::bit_cast<__nv_bfloat16>(bits));
          }
        }
      }
    }
    std::uint32_t out[4];
    for (int i = 0; i < 4; ++i) {
      if (kind == ReduceKind::F32) {
        out[i] = std::bit_cast<std::uint32_t>(acc[i]);
      } else {
        std::uint32_t word = 0;
        for (int h = 0; h < 2; ++h) {
          const std::uint16_t bits = kind == ReduceKind::F16
                                         ? std::bit_cast<std::uint16_t>(__float2half_rn(acc[2 * i + h]))
                                         : std::bit_cast<std::uint16_t>(__float2bfloat16_rn(acc[2 * i + h]));
          word |= static_cast<std::uint32_t>(bits) << (16 * h);
        }
        out[i] = word;
      }
    }
    return Vec16{out[0], out[1], out[2], out[3]};
  }

  /// A system-scope release add through the multicast mapping: `value` added to the word at `offset` of every
  /// member (multimem.red.release.sys.add.u32 on the GPU). The fence first gives it release order.
  void multicast_add_release(const MulticastView& view, std::size_t offset, std::uint32_t value) {
    count(Space::Multicast);
    fence_system();
    for (int m = 0; m < view.member_count; ++m) SystemAtomics::fetch_add_acq_rel(view.members[m] + offset, value);
  }

  /// Orders unicast and multicast accesses to the same memory (fence.proxy.alias on the GPU): one memory here.
  static void fence_multicast() { fence_system(); }

 private:
  void count(const void* p) {
    if (counter_ != nullptr) counter_->count(p);
  }
  void count(Space s) {
    if (counter_ != nullptr) counter_->count(s);
  }
  static Vec16 raw_load16(const std::uint32_t* p) {
    return Vec16{SystemAtomics::load_acquire(p), SystemAtomics::load_acquire(p + 1), SystemAtomics::load_acquire(p + 2),
                 SystemAtomics::load_acquire(p + 3)};
  }
  static void raw_store16(std::uint32_t* p, const Vec16& v) {
    SystemAtomics::store_release(p, v.x);
    SystemAtomics::store_release(p + 1, v.y);
    SystemAtomics::store_release(p + 2, v.z);
    SystemAtomics::store_release(p + 3, v.w);
  }

  template <class Op>
  float reduce(float x, Op op) {
    scratch_[lane_] = x;
    sync();
    float total = scratch_[0];
    for (int l = 1; l < lanes_; ++l) total = op(total, scratch_[l]);
    sync();  // nobody overwrites the scratch before every lane has read it
    return total;
  }

  template <class Op>
  float cluster_reduce(float mine, Op op) {
    if (cluster_size_ == 1) return mine;
    if (lane_ == 0) cluster_scratch_[cluster_rank()] = mine;
    cluster_barrier_->arrive_and_wait();
    float total = cluster_scratch_[0];
    for (int b = 1; b < cluster_size_; ++b) total = op(total, cluster_scratch_[b]);
    cluster_barrier_->arrive_and_wait();  // nobody overwrites a partial before every lane of the cluster has read it
    return total;
  }

  AccessCounter* counter_;
  int lane_, lanes_, block_, blocks_, cluster_size_;
  std::barrier<>* barrier_;
  std::barrier<>* cluster_barrier_;
  float* scratch_;
  float* cluster_scratch_;
  float* token_scratch_;
  float* group_scratch_;
};

/// A persistent grid of emulated lanes (blocks x lanes threads, in clusters of `cluster` consecutive blocks) that
/// runs one kernel at a time.
class HostGrid {
 public:
  HostGrid(int blocks, int lanes, int cluster = 1, AccessCounter* counter = nullptr)
      : blocks_(blocks), lanes_(lanes), cluster_(cluster), counter_(counter) {
    if (blocks < 1 || lanes < 1 || blocks * lanes > 4096) {
      throw std::invalid_argument("fiar: host emulator grid of " + std::to_string(blocks) + " blocks x " +
                                  std::to_string(lanes) +
                                  " lanes; allowed: at least 1 x 1 and at most 4096 lanes in all. Fix: pass a "
                                  "smaller HostPlatform grid.");
    }
    if (cluster < 1 || cluster > kMaxCluster || blocks % cluster != 0) {
      throw std::invalid_argument("fiar: host emulator cluster of " + std::to_string(cluster) +
                                  " blocks in a grid of " + std::to_string(blocks) + " blocks; allowed: 1 to " +
                                  std::to_string(kMaxCluster) +
                                  " blocks that divide the grid. Fix: pass HostPlatformOptions::cluster dividing "
                                  "HostPlatformOptions::blocks.");
    }
    for (int b = 0; b < blocks; ++b) barriers_.push_back(std::make_unique<std::barrier<>>(lanes));
    for (int c = 0; c < blocks / cluster; ++c) {
      cluster_barriers_.push_back(std::make_unique<std::barrier<>>(lanes * cluster));
    }
    cluster_scratch_.resize(static_cast<std::size_t>(blocks));
    token_scratch_.resize(static_cast<std::size_t>(blocks / cluster));
    scratch_.resize(static_cast<std::size_t>(blocks * lanes));
    threads_.reserve(static_cast<std::size_t>(blocks * lanes));
    for (int b = 0; b < blocks; ++b) {
      for (int l = 0; l < lanes; ++l) threads_.emplace_back([this, b, l] { lane_main(b, l); });
    }
  }
  HostGrid(const HostGrid&) = delete;
  HostGrid& operator=(const HostGrid&) = delete;
  ~HostGrid() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }

  [[nodiscard]] int blocks() const { return blocks_; }
  [[nodiscard]] int lanes() const { return lanes_; }
  [[nodiscard]] int cluster() const { return cluster_; }

  /// Runs kernel(ctx) on every lane and returns when all have returned (like a launch + stream sync).
  void run(const std::function<void(HostCtx&)>& kernel) {
    std::unique_lock lock(mutex_);
    kernel_ = &kernel;
    running_ = blocks_ * lanes_;
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [this] { return running_ == 0; });
    kernel_ = nullptr;
  }

 private:
  void lane_main(int block, int lane) {
    const auto first_of_cluster = static_cast<std::size_t>(block / cluster_ * cluster_);
    HostCtx ctx(lane, lanes_, block, blocks_, barriers_[static_cast<std::size_t>(block)].get(),
                scratch_.data() + static_cast<std::size_t>(block) * static_cast<std::size_t>(lanes_), cluster_,
                cluster_barriers_[static_cast<std::size_t>(block / cluster_)].get(),
                cluster_scratch_.data() + first_of_cluster, token_scratch(block / cluster_),
                token_scratch(block / cluster_) + kMaxTokenVecs, counter_);
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(HostCtx&)>* kernel = nullptr;
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        kernel = kernel_;
      }
      (*kernel)(ctx);
      std::lock_guard lock(mutex_);
      if (--running_ == 0) done_.notify_one();
    }
  }

  // A cluster's per-vector values for token_sum, then those for group_max (kMaxTokenVecs floats each), allocated by
  // its lanes' constructor.
  float* token_scratch(int c) {
    std::lock_guard lock(mutex_);
    auto& s = token_scratch_[static_cast<std::size_t>(c)];
    if (!s) s = std::make_unique<float[]>(2 * static_cast<std::size_t>(kMaxTokenVecs));
    return s.get();
  }

  int blocks_, lanes_, cluster_;
  AccessCounter* counter_;
  std::vector<std::unique_ptr<float[]>> token_scratch_;
  std::vector<std::unique_ptr<std::barrier<>>> barriers_;
  std::vector<std::unique_ptr<std::barrier<>>> cluster_barriers_;
  std::vector<float> scratch_;          // one float per lane, for block reductions
  std::vector<float> cluster_scratch_;  // one float per block, for cluster reductions
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(HostCtx&)>* kernel_ = nullptr;
  std::uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
};

static_assert(ExecutionContext<HostCtx>);

}  // namespace exec
FIAR_END_NAMESPACE
