// SPDX-License-Identifier: Apache-2.0
// fiar/backend/lamport.hpp — the Lamport engine: fiar's own kernels (algo/lamport.hpp, algo/multimem.hpp) over a
// region every rank maps, what Workspace runs trtllm's and mnnvl's one-shot, two-shot and in-switch calls on.
// Contract: Policy names the transport (trtllm: peer mappings; mnnvl: a multicast object as well, and InSwitch, the
// in-switch reduction), OneShot / TwoShot / InSwitch the operations; the engine owns nothing but pointers into the
// platform's memory and launches a call Workspace has validated and routed. A kernel that waited past the deadline, or
// saw a peer's call digest differ, makes check() and every later call throw until the workspace is recreated.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../algo/convert.hpp"
#include "../algo/epilogue.hpp"
#include "../algo/lamport.hpp"
#include "../algo/multimem.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/borrowed.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/errors.hpp"
#include "../core/pattern.hpp"
#include "../core/policy.hpp"
#include "../core/prelude.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../exec/vec.hpp"
#include "../platform/call_text.hpp"
#include "../platform/concept.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// Data words of one call of `tokens` tokens with strategy s (OneShot, TwoShot or Multimem) in a Lamport buffer.
constexpr std::size_t lamport_call_words(Strategy s, int world_size, int tokens, int vecs) {
  if (s == Strategy::Multimem) return algo::multimem_words(tokens, vecs);
  return s == Strategy::TwoShot ? algo::twoshot_words(world_size, tokens, vecs)
                                : algo::oneshot_words(world_size, tokens, vecs);
}

template <ReduceType T, Platform Pf, class Policy, template <auto, class> class OneShot,
          template <auto, class> class TwoShot, template <auto, class> class InSwitch = OneShot>
class LamportEngine {
 public:
  static constexpr bool kMulticast = Policy::needs_multicast;

  /// Words of one Lamport buffer (of three; a call uses one) for calls of up to max_tokens tokens, Strategy::Auto
  /// taking one-shot up to oneshot_max_bytes per rank.
  static std::size_t buffer_words(int world_size, const WorkspaceConfig& cfg, std::size_t oneshot_max_bytes,
                                  int max_tokens) {
    const int vecs = algo::detail::vecs_per_token<T>(cfg.hidden_dim);
    const std::size_t row_bytes = static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
    // Auto runs one-shot up to the threshold and whenever tokens < world size (choose_strategy).
    const std::size_t auto_oneshot_tokens = std::max<std::size_t>(oneshot_max_bytes / row_bytes, world_size - 1);
    const int oneshot_tokens = cfg.oneshot_at_max_tokens
                                   ? max_tokens
                                   : static_cast<int>(std::min<std::size_t>(auto_oneshot_tokens, max_tokens));
    return algo::header_words(world_size) + std::max(algo::oneshot_words(world_size, std::max(oneshot_tokens, 1), vecs),
                                                     algo::twoshot_words(world_size, max_tokens, vecs));
  }
  /// Bytes of rank-visible memory each rank allocates: three buffers, and (mnnvl) the multimem barrier counters.
  static std::size_t region_bytes(std::size_t buffer_words, const WorkspaceConfig& cfg) {
    return (algo::kLamportBuffers * buffer_words + counter_words(cfg)) * sizeof(std::uint32_t);
  }

  /// Collective: allocates and maps the region (mnnvl: a failure to set multicast up throws fiar::multicast_error on
  /// every rank alike), fills this rank's buffers with sentinels, and meets every rank once they are filled.
  template <Bootstrap B>
  LamportEngine(Pf& platform, B& boot, const Topology& topo, const WorkspaceConfig& cfg, std::size_t buffer_words)
      : timeout_(cfg.timeout) {
    const std::size_t lamport_words = algo::kLamportBuffers * buffer_words;
    const std::size_t region_words = lamport_words + counter_words(cfg);
    std::vector<std::uint32_t*> buffers;
    if constexpr (kMulticast) {
      // Peer mappings for the two-shot scatter, plus the group's multicast mapping of the same memory.
      auto region = platform.allocate_multicast(boot, region_words * sizeof(std::uint32_t));
      buffers = std::move(region.peers);
      links_.multicast = region.view;
    } else {
      buffers = platform.allocate_shared(boot, region_words * sizeof(std::uint32_t));
    }
    links_.vecs_per_token = algo::detail::vecs_per_token<T>(cfg.hidden_dim);
    links_.world_size = topo.world_size;
    links_.rank = topo.rank;
    for (int r = 0; r < topo.world_size; ++r) links_.buffers[r] = buffers[static_cast<std::size_t>(r)];
    links_.buffer_words = buffer_words;
    links_.state = static_cast<algo::LamportState*>(platform.allocate_local(sizeof(algo::LamportState)));
    error_ = Borrowed(static_cast<algo::ErrorRecord*>(platform.allocate_host_visible(sizeof(algo::ErrorRecord))));
    links_.error = error_.get();
    links_.timeout_ns =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(cfg.timeout).count());
    links_.verify = cfg.verify_calls;
    std::uint32_t* mine = buffers[static_cast<std::size_t>(topo.rank)];
    platform.fill_words(mine, lamport_words, exec::kSentinelWord);
    if constexpr (kMulticast) {
      platform.fill_words(mine + lamport_words, counter_words(cfg), 0u);
      generations_ = Borrowed(static_cast<std::uint32_t*>(
          platform.allocate_local(counter_words(cfg) * sizeof(std::uint32_t), "the multimem barrier generations")));
    }
    platform.synchronize();
    boot.barrier();  // no rank pushes into a buffer before its owner has filled it with sentinels
  }

  /// Launches a validated call of epilogue E (a Pattern, or user_epilogue<U>) with strategy s (OneShot, TwoShot, or
  /// Multimem on mnnvl); `epi` is the call as its kernels get it (a MoE finalize records a bad index where
  /// epi.index_error points).
  template <auto E>
  void launch(Pf& platform, const algo::CallParams<E, T>& epi, Strategy s, cudaStream_t stream) {
    algo::LamportParams<T, algo::CallParams<E, T>> p{};
    static_cast<algo::LamportLinks&>(p) = links_;
    p.epi = epi;
    p.digest = algo::CallDigest{0u, static_cast<std::uint32_t>(epi.num_tokens), epilogue_code<E>(),
                                s == Strategy::TwoShot    ? algo::kDigestTwoShot
                                : s == Strategy::Multimem ? algo::kDigestMultimem
                                                          : algo::kDigestOneShot};
    if constexpr (kMulticast) {
      if (s == Strategy::Multimem) {
        const std::size_t counters = algo::kLamportBuffers * p.buffer_words;
        return platform.template launch<InSwitch<E, T>>(
            algo::MultimemParams<T, algo::CallParams<E, T>>{p, counters, generations_.get()}, stream);
      }
    }
    if (s == Strategy::TwoShot) return platform.template launch<TwoShot<E, T>>(p, stream);
    platform.template launch<OneShot<E, T>>(p, stream);
  }

  /// The Lamport side of a call the workspace hands to NCCL, with verify_calls: a two-shot call of no tokens whose
  /// digest says the routed call's (num_tokens, epilogue E, kDigestNccl). Every rank that routes the call meets the
  /// others' digests here first, so a rank that runs it on the Lamport buffers instead (another strategy) finds a
  /// digest that differs and every rank raises fiar::mismatch_error, where the routed ranks would otherwise wait in a
  /// collective the other never joins. The buffer rotation and call numbers advance as for any call.
  template <auto E>
  void announce(Pf& platform, int num_tokens, cudaStream_t stream) {
    if (!links_.verify) return;
    algo::LamportParams<T> p{};
    static_cast<algo::LamportLinks&>(p) = links_;
    p.epi.num_tokens = 0;
    p.digest = algo::CallDigest{0u, static_cast<std::uint32_t>(num_tokens), epilogue_code<E>(), algo::kDigestNccl};
    platform.template launch<TwoShot<Pattern::AllReduce, T>>(p, stream);
  }

  /// Whether a call recorded a failure (raise_failure() throws it), or the engine was moved from.
  [[nodiscard]] bool failed() const { return !error_ || Pf::read_word(&error_->code) != algo::kErrorNone; }
  /// Throws what failed() found: fiar::mismatch_error if a call saw a peer's call digest differ from its own,
  /// fiar::timeout_error if a kernel gave up waiting (every later call throws too: the protocol state is lost),
  /// std::logic_error when moved from.
  [[noreturn]] void raise_failure() const {
    if (!error_) throw std::logic_error(moved_from_text("workspace"));
    raise(Pf::read_word(&error_->code));
  }

  /// Test hook: the protocol's call counter, as if `call` calls had completed; the buffer rotation goes on where it
  /// is. Every rank sets the same value between two calls.
  void set_call_counter(Pf& platform, std::uint32_t call) {
    platform.synchronize();
    platform.fill_words(&links_.state->call, 1, call);
    platform.synchronize();
  }

 private:
  // The multimem barrier counters after the Lamport buffers, one per token (mnnvl only).
  static std::size_t counter_words(const WorkspaceConfig& cfg) {
    return kMulticast ? static_cast<std::size_t>(std::max(cfg.max_token_num, 1)) : 0;
  }

  // The error the kernels recorded, as an exception (out of line: check() is on every call's path).
  [[noreturn]] void raise(std::uint32_t code) const {
    const int rank = links_.rank;
    if ((code & algo::kErrorMismatch) != 0) {
      auto digest = [](const std::uint32_t* w) {
        return algo::CallDigest{Pf::read_word(w), Pf::read_word(w + 1), Pf::read_word(w + 2), Pf::read_word(w + 3)};
      };
      throw mismatch_error(call_mismatch_text(to_string(Policy::backend), rank, digest(error_->mine),
                                              static_cast<int>(Pf::read_word(&error_->peer)), digest(error_->theirs)));
    }
    auto mask = [](const std::uint32_t* words) {
      return std::uint64_t{Pf::read_word(words)} | (std::uint64_t{Pf::read_word(words + 1)} << 32);
    };
    const std::uint64_t missing = mask(error_->missing);
    const std::uint64_t stalled = mask(error_->stalled);
    const std::uint32_t call = Pf::read_word(&error_->call);
    if ((code & algo::kErrorBarrier) != 0 && missing == 0 && stalled == 0) {
      throw timeout_error(call_timeout_text(
          to_string(Policy::backend), rank, timeout_,
          "at a barrier of the in-switch reduction (multimem): another rank's blocks never arrived (the barrier counts "
          "arrivals, so it cannot name the rank; the other ranks' errors can)",
          call));
    }
    const std::string waited = missing != 0
                                   ? "waiting for data from rank(s) " + rank_mask_text(missing)
                                   : "waiting for results reduced by rank(s) " + rank_mask_text(stalled) +
                                         " (two-shot owners: one of them, or a rank they wait for, is missing)";
    throw timeout_error(call_timeout_text(to_string(Policy::backend), rank, timeout_, waited, call));
  }

  algo::LamportLinks links_{};  ///< everything a call's kernel gets but the call itself, set at creation
  std::chrono::milliseconds timeout_;
  Borrowed<algo::ErrorRecord> error_;    ///< null once moved from
  Borrowed<std::uint32_t> generations_;  ///< mnnvl: each multimem barrier counter's value after its last call
};

}  // namespace detail
FIAR_END_NAMESPACE
