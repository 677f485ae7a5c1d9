// SPDX-License-Identifier: Apache-2.0
// fiar/core/config.hpp — what a workspace is created for (WorkspaceConfig) and the tensors of one fused call
// (FusedArgs).
// Contract: plain aggregates, every member with a default (designated initializers that name only some members
// draw no -Wmissing-field-initializers); every rank of a group passes the same WorkspaceConfig (checked at
// creation); which FusedArgs members a call must set is pattern_traits(P).use.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "dtype.hpp"
#include "pattern.hpp"
#include "prelude.hpp"
#include "strategy.hpp"
#include "topology.hpp"

FIAR_BEGIN_NAMESPACE

/// What a workspace is sized and tuned for; every rank must pass the same values (checked at creation).
struct WorkspaceConfig {
  int max_token_num = 0;  ///< most tokens (rows) one call reduces
  int hidden_dim = 0;     ///< elements per token; hidden_dim * sizeof(T) must be a multiple of 16
  /// Bound on every wait inside a kernel; on expiry the call fails with fiar::timeout_error.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  /// Per-rank message bytes up to which Strategy::Auto picks one-shot (default: the built-in table).
  std::optional<std::size_t> oneshot_max_bytes = std::nullopt;
  /// Size the buffers so that one-shot can run at max_token_num (default: only up to the one-shot threshold;
  /// larger calls use two-shot, which needs about 2 x tokens x hidden instead of W x).
  bool oneshot_at_max_tokens = false;
  /// Every call carries a digest (call number, num_tokens, pattern, strategy) that each rank compares with its peers'
  /// before it trusts their data: a rank whose call differs makes every rank raise fiar::mismatch_error instead of
  /// returning wrong data. false saves the digest's exchange (fiar-bench --verify-calls 0 shows its cost).
  bool verify_calls = true;
  /// mnnvl: per-rank message bytes from which Strategy::Auto takes the in-switch reduction (Strategy::Multimem) instead
  /// of one-shot / two-shot, at 2 ranks or more. Default: the built-in table's, which is fiar::never until the kernel
  /// is measured on NVSwitch hardware (scripts/model and fiar-bench --strategy multimem show where it pays).
  /// trtllm and nccl ignore it, so one configuration serves Backend::Auto's fallback too.
  std::optional<std::size_t> multimem_min_bytes = std::nullopt;
  /// trtllm / mnnvl: per-rank message bytes from which Strategy::Auto hands the call to NCCL inside this workspace
  /// (Strategy::Nccl: ncclAllReduce, then fiar's epilogue), at 2 ranks or more. Default: the built-in table's
  /// (default_strategy_thresholds: 64 MiB at 8 ranks on sm_90, never on PCIe). When a call of max_token_num tokens
  /// reaches it, creation also sets up the route (on GPUs an NCCL communicator, created from the bootstrap); a default
  /// route that cannot be set up (a build without NCCL, ranks sharing a GPU) is left out with one warning, a value
  /// given here makes creation fail instead. fiar::never: no route. The nccl backend ignores it.
  std::optional<std::size_t> nccl_min_bytes = std::nullopt;
  /// NCCL on GPUs (the nccl backend and the route): per-rank message bytes up to which ncclAllReduce runs in the
  /// registered symmetric window (copy in, NCCL's symmetric kernels, copy out or the epilogue's read), beyond which it
  /// runs in place on the caller's buffers (the copies would cost more than the symmetric kernels save). Default: the
  /// built-in table's (16 MiB on sm_90, 32 MiB on sm_100). 0: never the window.
  std::optional<std::size_t> nccl_symmetric_max_bytes = std::nullopt;
  /// A token's output bytes depend only on its own inputs, the weights, world size, backend, dtype, hidden_dim and
  /// architecture: fiar's Lamport kernels always give that (docs/design.md, "Batch invariance"); true also keeps
  /// Strategy::Auto off the NCCL route and the in-switch reduction, whose sums follow the message size, and makes
  /// forcing either throw std::invalid_argument. Agreed at creation like every other field.
  bool batch_invariant = false;
};

/// The row of the strategy table a workspace of `backend` resolves at creation for `topo` and `cfg`: the built-in
/// row (default_strategy_thresholds) with every threshold `cfg` gives in its place. Depends only on values every rank
/// of a group shares.
constexpr StrategyThresholds strategy_thresholds(Backend backend, const Topology& topo, const WorkspaceConfig& cfg) {
  StrategyThresholds t = default_strategy_thresholds(backend, topo.arch, topo.world_size, topo.interconnect);
  if (cfg.oneshot_max_bytes) t.oneshot_max_bytes = *cfg.oneshot_max_bytes;
  if (cfg.multimem_min_bytes) t.multimem_min_bytes = *cfg.multimem_min_bytes;
  if (cfg.nccl_min_bytes) t.nccl_min_bytes = *cfg.nccl_min_bytes;
  if (cfg.nccl_symmetric_max_bytes) t.nccl_symmetric_max_bytes = *cfg.nccl_symmetric_max_bytes;
  if (cfg.batch_invariant) {  // neither sum is a fixed function of the token alone
    t.multimem_min_bytes = never;
    t.nccl_min_bytes = never;
  }
  if (backend == Backend::Nccl) {  // no Lamport strategies, no route of its own: only the window's bound applies
    t.oneshot_max_bytes = 0;
    t.multimem_min_bytes = never;
    t.nccl_min_bytes = never;
  } else if (backend == Backend::Trtllm) {
    t.multimem_min_bytes = never;
  }
  return t;
}

/// The tensors and parameters of one fused call, checked against the pattern before anything runs: every tensor
/// the pattern uses must be given, and an output it does not use must be null. Shapes are [num_tokens, hidden_dim]
/// unless noted; device memory on CudaPlatform, host memory on HostPlatform.
template <ReduceType T>
struct FusedArgs {
  const T* in = nullptr;  ///< this rank's contribution
  int num_tokens = 0;
  T* out = nullptr;                ///< Pattern::AllReduce: the sum (may equal in)
  const T* residual_in = nullptr;  ///< residual patterns (ResidualRmsNorm*)
  T* residual_out = nullptr;       ///< residual patterns: sum + residual_in (may equal residual_in, or in)
  const T* gamma = nullptr;        ///< norm patterns: [hidden_dim]
  float eps = 1e-6f;               ///< RMSNorm epsilon
  float weight_bias = 0.0f;        ///< 0: x * gamma; 1: x * (1 + gamma) (Gemma style)
  T* norm_out = nullptr;           ///< ResidualRmsNorm, RmsNorm: required; quant patterns: optional (may equal in)
  void* quant_out = nullptr;       ///< fp8, mxfp8: [num_tokens, hidden_dim] bytes; nvfp4: [num_tokens, hidden_dim / 2]
  const float* scale = nullptr;    ///< fp8 static: the per-tensor scale; nvfp4: the global scale (device scalar)
  float* scale_out = nullptr;      ///< fp8 dynamic: [num_tokens] per-token scales
  /// nvfp4: e4m3 block scales, nvfp4_scale_bytes(num_tokens, hidden_dim, layout); mxfp8: e8m0 block scales,
  /// mxfp8_scale_bytes(num_tokens, hidden_dim, layout); fp8 group: the group scales,
  /// fp8_group_scale_bytes(num_tokens, hidden_dim, group_size, group_scale)
  void* block_scale_out = nullptr;
  ScaleLayout layout = ScaleLayout::Swizzled128x4;  ///< nvfp4 and mxfp8 block-scale layout
  const T* gamma_pre =
      nullptr;  ///< ResidualRmsNormPrePost: the first norm's weight, [hidden_dim] (gamma: the second's)
  /// fp8 group: elements per scale group, a power-of-two multiple of the 16-byte vector's elements (8 for half / bf16,
  /// 4 for float), at most 32 vectors, dividing hidden_dim
  int group_size = 128;
  GroupScale group_scale = GroupScale::Ue8m0Packed;  ///< fp8 group: how block_scale_out stores the scales
  /// MoE finalize: for token t and k < top_k, the row of `in` (this rank's permuted expert output,
  /// [num_permuted_rows, hidden_dim]) holding its k-th expert's output, or -1 (none): int32 [num_tokens, top_k]
  const int* expanded_idx_to_permuted_idx = nullptr;
  const float* expert_scale = nullptr;  ///< MoE finalize: the router weights, fp32 [num_tokens, top_k]
  const T* shared_expert_out =
      nullptr;                ///< MoE finalize (optional): the shared expert's output, [num_tokens, hidden_dim]
  int top_k = 0;              ///< MoE finalize: experts per token, 1 to kMaxTopK
  int num_permuted_rows = 0;  ///< MoE finalize: rows of `in`
  float routed_scaling_factor = 1.0f;  ///< MoE finalize: multiplies every expert_scale
};

/// The address of tensor t of a call (null when unset).
template <ReduceType T>
constexpr const void* tensor_address(const FusedArgs<T>& a, FusedTensor t) {
  switch (t) {
    case FusedTensor::In: return a.in;
    case FusedTensor::Out: return a.out;
    case FusedTensor::ResidualIn: return a.residual_in;
    case FusedTensor::ResidualOut: return a.residual_out;
    case FusedTensor::Gamma: return a.gamma;
    case FusedTensor::NormOut: return a.norm_out;
    case FusedTensor::QuantOut: return a.quant_out;
    case FusedTensor::Scale: return a.scale;
    case FusedTensor::ScaleOut: return a.scale_out;
    case FusedTensor::BlockScaleOut: return a.block_scale_out;
    case FusedTensor::GammaPre: return a.gamma_pre;
    case FusedTensor::ExpandedIdx: return a.expanded_idx_to_permuted_idx;
    case FusedTensor::ExpertScale: return a.expert_scale;
    case FusedTensor::SharedExpertOut: return a.shared_expert_out;
  }
  return nullptr;
}

FIAR_END_NAMESPACE
