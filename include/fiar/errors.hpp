// fiar/errors.hpp — the exception types fiar raises besides std::invalid_argument.
// Contract: bad arguments, configurations and topologies raise std::invalid_argument; failed CUDA or
// NCCL calls raise fiar::cuda_error; an expired bounded wait raises fiar::timeout_error.
#pragma once

#include <stdexcept>
#include <string>

#include "version.hpp"

namespace fiar::inline v0_1 {

/// A CUDA runtime, driver or NCCL call failed; `status()` is the raw status code of that API.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(const std::string& what, int status) : std::runtime_error(what), status_(status) {}
  /// The raw status (cudaError_t, CUresult or ncclResult_t, depending on the call named in what()).
  [[nodiscard]] int status() const noexcept { return status_; }

 private:
  int status_;
};

/// A bounded wait expired: a peer rank never arrived (crashed, hung, or is in another collective).
class timeout_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fiar::inline v0_1
