// SPDX-License-Identifier: Apache-2.0
// fiar/backend/nccl.hpp — the NCCL engine: a library all-reduce, then the fused epilogue as an operation of its own
// (NcclEpilogue over algo/epilogue_pass.hpp). The nccl backend's workspace is this engine alone; trtllm and mnnvl run
// their calls from nccl_min_bytes on it (Strategy::Nccl, their NCCL route).
// Contract: one source for both platforms: the sum is the platform's collective (ncclAllReduce on CudaPlatform,
// platform/nccl_collective.hpp; a host reduction among the emulated ranks on HostPlatform,
// platform/host_collective.hpp), which bounds every call and records failures; NCCL is optional at build time
// (FIAR_HAS_NCCL): without it creation_error() says why a CUDA engine cannot be created.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../algo/convert.hpp"
#include "../algo/epilogue.hpp"
#include "../algo/epilogue_pass.hpp"
#include "../algo/user_epilogue.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/topology.hpp"
#include "../platform/concept.hpp"
#include "../platform/host.hpp"
#include "../platform/host_collective.hpp"
#include "../platform/nccl_collective.hpp"

/// The operations this backend launches (<fiar/instantiate.cuh> emits one kernel per operation x pattern x dtype).
#define FIAR_NCCL_OPERATIONS(X) FIAR_DETAIL_NCCL_OPERATIONS_WITH(FIAR_DETAIL_APPLY, X)
// X(args..., Op) for each of them.
#define FIAR_DETAIL_NCCL_OPERATIONS_WITH(X, ...) X(__VA_ARGS__, NcclEpilogue)

FIAR_BEGIN_NAMESPACE

/// The NCCL engine's kernel: the fused epilogue over the sum the collective wrote.
template <auto P, class T>
struct NcclEpilogue : algo::EpiloguePass<P, T> {
  static constexpr const char* name = "nccl epilogue";
};

namespace detail {

template <ReduceType T, Platform Pf>
class NcclEngine {
  using Collective = std::conditional_t<std::is_same_v<Pf, HostPlatform>, HostCollective, NcclCollective>;

 public:
  /// Bytes of one [max_token_num, hidden_dim] tensor of T: the largest call.
  static std::size_t max_bytes(const WorkspaceConfig& cfg) {
    return static_cast<std::size_t>(cfg.max_token_num) * static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
  }
  /// Bytes fiar allocates per rank (a library's own buffers come on top).
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return Collective::required_bytes(topo.world_size, max_bytes(cfg));
  }
  /// Why the engine cannot exist in this build ("" when it can: always on the host emulator).
  static std::string creation_error() {
    return Collective::creation_error("Workspace<NcclPolicy, " + std::string(dtype_name<T>()) + ", CudaPlatform>");
  }

  /// Collective: the platform's collective for calls of up to max_token_num tokens; `adopt...`: an NCCL
  /// communicator to adopt (nccl on CudaPlatform).
  template <Bootstrap B, class... Adopt>
  NcclEngine(Pf& platform, B& boot, const Topology& topo, const WorkspaceConfig& cfg, std::size_t symmetric_max_bytes,
             Adopt&&... adopt)
      : coll_(platform, boot, topo, cfg, max_bytes(cfg), symmetric_max_bytes, std::forward<Adopt>(adopt)...),
        vecs_per_token_(algo::detail::vecs_per_token<T>(cfg.hidden_dim)) {}

  /// Before a call's checks: the collective's recorded failures (CUDA: and whether the stream is being captured).
  void begin_call(cudaStream_t stream) { coll_.begin_call(stream); }

  /// Launches a validated call of epilogue E (a Pattern, or user_epilogue<U>; `epi` the call as its kernels get it):
  /// the sum into `out` (a plain sum: AllReduce, MoeFinalizeAllReduce) or the collective's buffer, then the epilogue.
  /// A MoE finalize first writes this rank's contributions where the collective reads its input (the epilogue's
  /// kernel in its finalize mode), recording a bad index where epi.index_error points.
  template <auto E>
  void launch(Pf& platform, const algo::CallParams<E, T>& epi, int hidden_dim, cudaStream_t stream) {
    constexpr bool kPlainSum = [] {
      if constexpr (is_pattern_v<E>) {
        return !pattern_traits(E).norm;
      } else {
        return false;
      }
    }();
    using PassParams = algo::EpiloguePassParams<T, algo::CallParams<E, T>>;
    const std::size_t count = static_cast<std::size_t>(epi.num_tokens) * static_cast<std::size_t>(hidden_dim);
    T* const out = kPlainSum ? epi.out : nullptr;
    const T* in = epi.in;
    if constexpr (epilogue_prologue<E>() == Prologue::MoeFinalize) {
      T* const staged = coll_.staging(out, count);
      platform.template launch<NcclEpilogue<E, T>>(
          PassParams{nullptr, nullptr, epi.num_tokens, vecs_per_token_, epi, staged}, stream);
      in = staged;
    }
    wait_if_queued(platform, stream);  // the emulator's library sum runs on the host, after what is queued
    const T* sum = coll_.allreduce(in, out, epi.num_tokens, count, epilogue_code<E>(), to_string(E), stream);
    if constexpr (!kPlainSum) {
      platform.template launch<NcclEpilogue<E, T>>(PassParams{sum, nullptr, epi.num_tokens, vecs_per_token_, epi},
                                                   stream);
    }
    coll_.end_call(stream);
  }

  void check() const { coll_.check(); }
  /// The workspace failed elsewhere (its Lamport engine): release what a routed call may still wait on.
  void abandon() const { coll_.abandon(); }
  /// Throws a failure a call recorded (cheap: no query of the library or the device).
  void check_recorded() const { coll_.check_recorded(); }
  void set_call_counter(std::uint32_t call) { coll_.set_call_counter(call); }
  [[nodiscard]] const Collective& collective() const { return coll_; }

 private:
  Collective coll_;
  int vecs_per_token_;
};

}  // namespace detail
FIAR_END_NAMESPACE
