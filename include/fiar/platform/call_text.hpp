// SPDX-License-Identifier: Apache-2.0
// fiar/platform/call_text.hpp — the messages of a call that failed between ranks: one that waited past its deadline,
// and ranks whose calls differ (their call digests, algo::CallDigest). Written once for every engine and platform.
// Contract: host only; built only when a call has failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "../algo/lamport.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// "fiar: <backend> all-reduce on rank <r> gave up after <t> ms <waited> (call <c>): ...": a call that waited past its
/// deadline, on any backend.
inline std::string call_timeout_text(std::string_view backend, int rank, std::chrono::milliseconds timeout,
                                     const std::string& waited, std::uint64_t call) {
  return "fiar: " + std::string(backend) + " all-reduce on rank " + std::to_string(rank) + " gave up after " +
         std::to_string(timeout.count()) + " ms " + waited + " (call " + std::to_string(call) +
         "): a rank crashed, hung, or launched a different sequence of collectives. Fix: find that rank's failure; "
         "the workspace is unusable now, so recreate it on every rank.";
}

/// A call digest as the error message shows it: "call 3, num_tokens 8, pattern allreduce, strategy oneshot" (strategy
/// "auto" for an engine without strategies of its own, which sends 0).
inline std::string call_digest_text(const algo::CallDigest& d) {
  const auto pat = static_cast<Pattern>(d.pattern);
  const std::string pattern_name = is_valid(pat) ? std::string(to_string(pat))
                                   : (d.pattern & 0xC0000000u) == kUserEpilogueCode
                                       ? "user epilogue " + hex_text(d.pattern)  // its name hashed (epilogue_code)
                                       : "pattern value " + std::to_string(d.pattern);
  const char* strategy_name = d.strategy == algo::kDigestOneShot    ? "oneshot"
                              : d.strategy == algo::kDigestTwoShot  ? "twoshot"
                              : d.strategy == algo::kDigestMultimem ? "multimem"
                              : d.strategy == algo::kDigestNccl     ? "nccl"
                                                                    : "auto";
  return "call " + std::to_string(d.call) + ", num_tokens " + std::to_string(d.num_tokens) + ", pattern " +
         pattern_name + ", strategy " + strategy_name;
}

/// "fiar: <backend> all-reduce on rank <r> ... does not match rank <p>'s ...": ranks that made different calls.
inline std::string call_mismatch_text(std::string_view backend, int rank, const algo::CallDigest& mine, int peer,
                                      const algo::CallDigest& theirs) {
  return "fiar: " + std::string(backend) + " all-reduce on rank " + std::to_string(rank) + " was called with {" +
         call_digest_text(mine) + "} but rank " + std::to_string(peer) + " with {" + call_digest_text(theirs) +
         "}; nothing reduced from the two was returned. Every rank of the group must make the same sequence of calls "
         "with the same num_tokens, pattern and strategy. Fix: make the ranks agree (e.g. pad the batch to the same "
         "num_tokens on every rank); the workspace is unusable now, so recreate it on every rank.";
}

}  // namespace detail
FIAR_END_NAMESPACE
