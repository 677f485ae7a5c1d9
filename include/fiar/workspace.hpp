// fiar/workspace.hpp — the all-reduce workspace of one backend and one element type, and its configuration.
// Contract: Workspace<P, T, Platform> exists only for an AllreducePolicy P and a ReduceType T; naming it
// with anything else is a compile error that names the unmet concept.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "dtype.hpp"
#include "policy.hpp"
#include "version.hpp"

namespace fiar::inline v0_1 {

struct CudaPlatform;

/// What a workspace is sized and tuned for; every rank must pass the same values (checked at creation).
struct WorkspaceConfig {
  int max_token_num = 0;  ///< most tokens (rows) one call reduces
  int hidden_dim = 0;     ///< elements per token; hidden_dim * sizeof(T) must be a multiple of 16
  /// Bound on every wait inside a kernel; on expiry the call fails with fiar::timeout_error.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  /// Per-rank message bytes up to which Strategy::Auto picks one-shot (default: the built-in table).
  std::optional<std::size_t> oneshot_max_bytes;
  /// Size the buffers so that one-shot can run at max_token_num (default: only up to the one-shot
  /// threshold; larger calls use two-shot, which needs about 2 x tokens x hidden instead of W x).
  bool oneshot_at_max_tokens = false;
};

/// The per-group buffers and protocol state of backend P for element type T, on Platform
/// (CudaPlatform: GPUs; HostPlatform: the host emulator).
template <AllreducePolicy P, ReduceType T, class Platform = CudaPlatform>
class Workspace;

}  // namespace fiar::inline v0_1
