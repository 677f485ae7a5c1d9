// SPDX-License-Identifier: Apache-2.0
// fiar/core/errors.hpp — the exception types fiar raises besides std::invalid_argument.
// Contract: bad arguments, configurations and topologies raise std::invalid_argument; failed CUDA or NCCL calls
// raise fiar::cuda_error (fiar::multicast_error when multicast setup failed); an expired bounded wait raises
// fiar::timeout_error.
#pragma once

#include <stdexcept>
#include <string>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// A CUDA runtime, driver or NCCL call failed; `status()` is the raw status code of that API.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(const std::string& what, int status) : std::runtime_error(what), status_(status) {}
  /// The raw status (cudaError_t, CUresult or ncclResult_t, depending on the call named in what()).
  [[nodiscard]] int status() const noexcept { return status_; }

 private:
  int status_;
};

/// The machine cannot set NVLink multicast up for the group (no NVSwitch multicast, no fabric handles across
/// nodes, a multicast call failed). Thrown on every rank alike by the mnnvl workspace's creation; it is the one
/// failure after which make_workspace may fall back from an automatic mnnvl choice to trtllm.
class multicast_error : public cuda_error {
 public:
  using cuda_error::cuda_error;
};

/// A bounded wait expired: a peer rank never arrived (crashed, hung, or is in another collective).
class timeout_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The ranks of a group made different calls: each call carries a digest (call number, num_tokens, pattern,
/// strategy) with its data, and a rank that sees a peer's digest differ from its own raises this (so does every rank
/// of the group) instead of returning data reduced from mismatched calls. The workspace is unusable afterwards.
class mismatch_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

FIAR_END_NAMESPACE
