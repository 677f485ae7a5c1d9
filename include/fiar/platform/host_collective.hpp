// SPDX-License-Identifier: Apache-2.0
// fiar/platform/host_collective.hpp — HostCollective: the host emulator's library all-reduce, what the NCCL engine
// sums with on HostPlatform where ncclAllReduce sums on CudaPlatform (platform/nccl_collective.hpp).
// Contract: collective like ncclAllReduce (every rank makes the same calls in the same order); each call copies this
// rank's input into its block of a region every rank sees, waits (bounded by the timeout) until every rank has, sums
// every block in rank order in fp32 from +0 (identical bits on every rank, the numerics of fiar's kernels), and waits
// until every rank has read. With verify_calls the ranks compare call digests first. A failure makes this and every
// later call throw (fiar::timeout_error, fiar::mismatch_error).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../algo/convert.hpp"
#include "../algo/lamport.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/errors.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../exec/atomics.hpp"
#include "call_text.hpp"
#include "host.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

class HostCollective {
 public:
  /// Bytes each rank allocates for calls of up to max_bytes: its block of the shared region (arrival words, a call
  /// digest, one input) and a local buffer for sums the caller does not take in place.
  static std::size_t required_bytes(int world_size, std::size_t max_bytes) {
    return block_bytes(world_size, max_bytes) + max_bytes;
  }
  /// Why the collective cannot exist in this build: the emulator's always can.
  static std::string creation_error(std::string_view) { return ""; }

  /// Collective: every rank's block, zero-filled (every arrival word starts at 0), and the local sum buffer.
  template <Bootstrap B>
  HostCollective(HostPlatform& platform, B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                 std::size_t max_bytes, std::size_t /*symmetric_max_bytes: NCCL's, none here*/)
      : rank_(topo.rank), world_(topo.world_size), timeout_(cfg.timeout), verify_(cfg.verify_calls) {
    blocks_ = platform.allocate_shared(boot, block_bytes(world_, max_bytes));
    scratch_ = Borrowed(static_cast<std::byte*>(platform.allocate_local(max_bytes, "the sum buffer")));
  }

  void begin_call(cudaStream_t) const { check(); }
  /// Throws the failure a call recorded, if any (no other work: the Lamport path's check before every launch).
  void check_recorded() const { check(); }
  void end_call(cudaStream_t) const {}

  /// Where a call whose input a kernel writes first (the MoE finalize) should put it: `out`, else the sum buffer.
  template <ReduceType T>
  T* staging(T* out, std::size_t) const {
    return out != nullptr ? out : reinterpret_cast<T*>(scratch_.get());
  }

  /// Sums `count` elements of `in` over the ranks into `out` (null: the collective's own buffer; either may be `in`:
  /// it is copied out first); returns where the sum is. Synchronous.
  template <ReduceType T>
  const T* allreduce(const T* in, T* out, int num_tokens, std::size_t count, std::uint32_t code,
                     const char* /*epilogue*/, cudaStream_t) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const std::uint64_t call = calls_++;
    // Sequence numbers of this call's two arrivals: consecutive calls' barriers cannot be confused.
    const auto arrival = static_cast<std::uint32_t>(2 * call + 1);
    std::memcpy(data_of(rank_), in, count * sizeof(T));
    const algo::CallDigest mine{static_cast<std::uint32_t>(call & 0x7fffffffu), static_cast<std::uint32_t>(num_tokens),
                                code, 0u};
    if (verify_) publish_digest(mine);
    if (!arrive_and_wait(arrival, deadline, call, "waiting for the input of rank(s) ")) check();
    if (verify_) compare_digests(mine);
    T* sum = out != nullptr ? out : reinterpret_cast<T*>(scratch_.get());
    reduce(sum, count);
    // Nobody overwrites its block (next call) before every rank has read it.
    if (!arrive_and_wait(arrival + 1, deadline, call, "waiting for rank(s) ")) check();
    return sum;
  }

  /// Throws fiar::mismatch_error if a call found a rank's call digest different from its own, and
  /// fiar::timeout_error if one gave up waiting for a rank (then every later call throws the same).
  void check() const {
    if (!scratch_) throw std::logic_error(moved_from_text("workspace"));
    if (mismatch_) throw mismatch_error(failure_);
    if (!failure_.empty()) throw timeout_error(failure_);
  }

  /// The workspace failed elsewhere: nothing to release (a call here is synchronous, so none is in flight).
  void abandon() const {}

  /// Test hook: calls numbered from `call` on, the arrival sequence with them (this rank's word as if call - 1 had
  /// completed). Every rank sets the same value between two calls, then meets.
  void set_call_counter(std::uint32_t call) {
    calls_ = call;
    exec::SystemAtomics::store_release(blocks_[0] + rank_, static_cast<std::uint32_t>(2 * calls_));
  }

 private:
  // Rank 0's block starts with one arrival word per rank; every block then holds its rank's call digest (4 words
  // after the arrival words) and one input, 64-byte aligned.
  static std::size_t header_bytes(int world_size) {
    return (static_cast<std::size_t>(world_size + 4) * sizeof(std::uint32_t) + 63) / 64 * 64;
  }
  static std::size_t block_bytes(int world_size, std::size_t max_bytes) { return header_bytes(world_size) + max_bytes; }
  std::uint32_t* digest_of(int rank) const { return blocks_[static_cast<std::size_t>(rank)] + world_; }
  std::byte* data_of(int rank) const {
    return reinterpret_cast<std::byte*>(blocks_[static_cast<std::size_t>(rank)]) + header_bytes(world_);
  }

  // Written before this rank's arrival (a release store), read by the peers after they saw it.
  void publish_digest(const algo::CallDigest& d) const {
    std::uint32_t* w = digest_of(rank_);
    const std::uint32_t words[4] = {d.call, d.num_tokens, d.pattern, d.strategy};
    for (int i = 0; i < 4; ++i) exec::SystemAtomics::store_relaxed(w + i, words[i]);
  }
  // Every rank compares every digest after the first arrival, so all of them raise together on a mismatch (none
  // waits at the second arrival) and none has reduced data from a different call.
  void compare_digests(const algo::CallDigest& mine) {
    for (int r = 0; r < world_; ++r) {
      const std::uint32_t* w = digest_of(r);
      const algo::CallDigest theirs{exec::SystemAtomics::load_relaxed(w), exec::SystemAtomics::load_relaxed(w + 1),
                                    exec::SystemAtomics::load_relaxed(w + 2), exec::SystemAtomics::load_relaxed(w + 3)};
      if (!(theirs == mine)) {
        failure_ = call_mismatch_text("nccl", rank_, mine, r, theirs);
        mismatch_ = true;
        check();
      }
    }
  }

  // Publishes this rank's arrival `target` and waits until every rank's word has reached it, or the deadline passes
  // (then records which ranks are missing and returns false).
  bool arrive_and_wait(std::uint32_t target, std::chrono::steady_clock::time_point deadline, std::uint64_t call,
                       const char* waited) {
    std::uint32_t* words = blocks_[0];
    exec::SystemAtomics::store_release(words + rank_, target);
    auto behind = [&](int r) {
      return static_cast<std::int32_t>(exec::SystemAtomics::load_acquire(words + r) - target) < 0;
    };
    for (int r = 0; r < world_; ++r) {
      for (int spin = 0; behind(r); ++spin) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::vector<int> missing;
          for (int m = 0; m < world_; ++m) {
            if (behind(m)) missing.push_back(m);
          }
          failure_ = call_timeout_text("nccl", rank_, timeout_, waited + rank_list(missing), call);
          return false;
        }
        if (spin < 256) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
    return true;
  }

  // The sum of every rank's block in rank order, in fp32 from +0, rounded to T; a -0 result is written +0 (fiar's
  // documented numerics, bit-identical to the Lamport kernels').
  template <ReduceType T>
  void reduce(T* out, std::size_t count) const {
    for (std::size_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < world_; ++r) acc += algo::to_float(reinterpret_cast<const T*>(data_of(r))[i]);
      T v = algo::from_float<T>(acc);
      if (algo::to_float(v) == 0.0f) v = algo::from_float<T>(0.0f);
      out[i] = v;
    }
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  bool verify_;
  std::vector<std::uint32_t*> blocks_;
  Borrowed<std::byte> scratch_;  ///< the sums the caller does not take in place; null once moved from
  std::uint64_t calls_ = 0;
  std::string failure_;
  bool mismatch_ = false;
};

}  // namespace detail
FIAR_END_NAMESPACE
