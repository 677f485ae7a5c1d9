// SPDX-License-Identifier: Apache-2.0
// fiar/backend/validate.hpp — the checks every backend runs before creating a workspace (and the ranks' agreement on
// them) or launching a call, driven by the pattern table (core/pattern.hpp).
// Contract: a configuration, topology or call that cannot work throws std::invalid_argument naming the value, the
// rule and the fix; nothing is allocated or launched before these checks pass.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../algo/quant.hpp"
#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../core/version.hpp"
#include "../exec/context.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

// The configuration checks every backend shares ("" when cfg passes them): max_token_num, hidden_dim (whole
// 16-byte vectors of T) and timeout.
template <ReduceType T>
std::string common_config_error(const WorkspaceConfig& cfg) {
  const std::string dt(dtype_name<T>());
  if (cfg.max_token_num < 1) {
    return "fiar: WorkspaceConfig::max_token_num = " + std::to_string(cfg.max_token_num) +
           "; allowed: 1 or more. Fix: pass the most tokens one call will reduce.";
  }
  if (cfg.hidden_dim < 1 || (static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T)) % 16 != 0) {
    return "fiar: WorkspaceConfig::hidden_dim = " + std::to_string(cfg.hidden_dim) + " for " + dt +
           "; allowed: a positive multiple of " + std::to_string(16 / sizeof(T)) +
           " (16-byte vectors). Fix: pad the hidden dimension.";
  }
  if (static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T) / 16 > static_cast<std::size_t>(exec::kMaxTokenVecs)) {
    return "fiar: WorkspaceConfig::hidden_dim = " + std::to_string(cfg.hidden_dim) + " for " + dt +
           "; allowed: at most " + std::to_string(exec::kMaxTokenVecs * 16 / static_cast<int>(sizeof(T))) +
           " (the norm's canonical sum holds " + std::to_string(exec::kMaxTokenVecs) +
           " 16-byte vectors per token). Fix: split the hidden dimension over more ranks or calls.";
  }
  if (cfg.batch_invariant && ((cfg.nccl_min_bytes && *cfg.nccl_min_bytes != never) ||
                              (cfg.multimem_min_bytes && *cfg.multimem_min_bytes != never))) {
    return std::string("fiar: WorkspaceConfig::batch_invariant = true with ") +
           (cfg.nccl_min_bytes && *cfg.nccl_min_bytes != never
                ? "nccl_min_bytes = " + std::to_string(*cfg.nccl_min_bytes)
                : "multimem_min_bytes = " + std::to_string(*cfg.multimem_min_bytes)) +
           "; allowed: neither the NCCL route nor the in-switch reduction, whose sums follow the message size. Fix: "
           "leave nccl_min_bytes and multimem_min_bytes unset (or fiar::never), or batch_invariant false.";
  }
  if (cfg.timeout.count() < 1 || cfg.timeout > std::chrono::hours(24)) {
    return "fiar: WorkspaceConfig::timeout = " + std::to_string(cfg.timeout.count()) +
           " ms; allowed: 1 ms to 24 h. Fix: pass a bound a healthy call never reaches (default 30 s).";
  }
  return "";
}

// Whether Policy's backend can run on `topo` ("" when it can), as check_topology's message.
template <class Policy>
std::string topology_error(const Topology& topo) {
  try {
    check_topology<Policy>(topo);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// This rank's objection to creating a workspace of Policy over `boot` ("" when none): the topology, its match with
// the bootstrap, then config_error() (the backend's checks of the configuration, which may size buffers from the
// topology: called only when the topology passed).
template <class Policy, Bootstrap B, class ConfigError>
std::string local_creation_error(const Topology& topo, B& boot, ConfigError&& config_error) {
  if (std::string e = topology_error<Policy>(topo); !e.empty()) return e;
  if (topo.world_size != boot.size() || topo.rank != boot.rank()) {
    return "fiar: the topology says world_size " + std::to_string(topo.world_size) + ", rank " +
           std::to_string(topo.rank) + ", but the bootstrap says size " + std::to_string(boot.size()) + ", rank " +
           std::to_string(boot.rank()) +
           ". Fix: discover the topology over the same bootstrap (discover_topology(boot)).";
  }
  return config_error();
}

// "fiar: <epilogue> on rank <rank>: ", the start of every message about a call (the pattern's name, or a user
// epilogue's).
inline std::string call_where(const char* epilogue, int rank) {
  return "fiar: " + std::string(epilogue) + " on rank " + std::to_string(rank) + ": ";
}

// The call-level checks before the backend's own (strategy) and the epilogue's (validate_fused, validate_user): the
// strategy is an enumerator, `in` is set, `out` too for a plain all-reduce (needs_out), and 1 <= num_tokens <=
// max_token_num. The message's opening is written only when a check fails: no string on the success path.
inline void validate_call_basics(int rank, const char* epilogue, bool needs_out, Strategy strategy, const void* in,
                                 const void* out, int num_tokens, int max_token_num) {
  auto where = [&] { return call_where(epilogue, rank); };
  if (!is_valid(strategy)) throw std::invalid_argument(where() + strategy_value_text(strategy));
  if (in == nullptr || (needs_out && out == nullptr)) {
    throw std::invalid_argument(where() + (in == nullptr ? "in" : "out") +
                                " is a null pointer. Fix: pass [num_tokens, hidden_dim] buffers.");
  }
  if (num_tokens < 1 || num_tokens > max_token_num) {
    throw std::invalid_argument(where() + "num_tokens = " + std::to_string(num_tokens) +
                                "; allowed: 1 to max_token_num = " + std::to_string(max_token_num) +
                                ". Fix: split the call, or create the workspace with a larger max_token_num.");
  }
}

// What sizes a call's tensors beyond [num_tokens, hidden_dim]: block_scale_out's layout (NVFP4, MXFP8) or the FP8
// groups and their format; the MoE finalize's experts per token and rows of `in`.
struct TensorShape {
  ScaleLayout layout = ScaleLayout::Swizzled128x4;
  int group_size = 0;
  GroupScale group_scale = GroupScale::Ue8m0Packed;
  int top_k = 0;
  int permuted_rows = 0;
};

// Bytes of tensor t of a call of a pattern (rows tokens, hidden elements of elem_bytes each per row).
constexpr std::size_t tensor_bytes(FusedTensor t, const PatternTraits& traits, std::size_t elem_bytes, std::size_t rows,
                                   std::size_t hidden, const TensorShape& shape) {
  switch (t) {
    case FusedTensor::Gamma:
    case FusedTensor::GammaPre: return hidden * elem_bytes;
    case FusedTensor::In:
      return traits.prologue == Prologue::MoeFinalize
                 ? static_cast<std::size_t>(shape.permuted_rows > 0 ? shape.permuted_rows : 0) * hidden * elem_bytes
                 : rows * hidden * elem_bytes;
    case FusedTensor::ExpandedIdx:
    case FusedTensor::ExpertScale: return rows * static_cast<std::size_t>(shape.top_k > 0 ? shape.top_k : 0) * 4;
    case FusedTensor::QuantOut: return traits.quant == Quant::Nvfp4 ? rows * hidden / 2 : rows * hidden;
    case FusedTensor::Scale: return sizeof(float);
    case FusedTensor::ScaleOut: return rows * sizeof(float);
    case FusedTensor::BlockScaleOut:
      if (traits.quant == Quant::Fp8Group) {
        return algo::fp8_group_scale_bytes(static_cast<int>(rows), static_cast<int>(hidden), shape.group_size,
                                           shape.group_scale);
      }
      return algo::block_scale_bytes(
          static_cast<int>(rows),
          static_cast<int>(traits.quant == Quant::Mxfp8 ? hidden / algo::kMxfp8Block : hidden / algo::kNvfp4Block),
          is_valid(shape.layout) ? shape.layout : ScaleLayout::Linear);
    default: return rows * hidden * elem_bytes;
  }
}
constexpr std::size_t tensor_alignment(FusedTensor t, const PatternTraits& traits) {
  switch (t) {
    case FusedTensor::Scale:
    case FusedTensor::ScaleOut:
    case FusedTensor::ExpandedIdx:
    case FusedTensor::ExpertScale: return alignof(float);
    case FusedTensor::BlockScaleOut: return traits.quant == Quant::Fp8Group ? 4 : 1;  // int32 / fp32 elements
    default: return 16;
  }
}
constexpr bool is_output(FusedTensor t) {
  return t == FusedTensor::Out || t == FusedTensor::ResidualOut || t == FusedTensor::NormOut ||
         t == FusedTensor::QuantOut || t == FusedTensor::ScaleOut || t == FusedTensor::BlockScaleOut;
}
// The aliases inference engines rely on, each allowed only exactly (same address, same size). Onto `in`: an output
// element of a token is written only once the token's sum has arrived, which every rank's push of that element
// (this rank's read of it) precedes, and the epilogue reads the sum, never `in` again (vLLM passes norm_out = in, or
// residual_out = in with a zero residual for the sum beside the norm). Not onto a MoE finalize's `in`: its rows are
// other tokens' experts, read while earlier tokens' outputs are written.
constexpr bool allowed_alias(FusedTensor x, FusedTensor y, const PatternTraits& traits) {
  auto pair = [&](FusedTensor a, FusedTensor b) { return (x == a && y == b) || (x == b && y == a); };
  const bool onto_in = traits.prologue == Prologue::None;
  return (onto_in && (pair(FusedTensor::Out, FusedTensor::In) || pair(FusedTensor::NormOut, FusedTensor::In) ||
                      pair(FusedTensor::ResidualOut, FusedTensor::In))) ||
         pair(FusedTensor::ResidualOut, FusedTensor::ResidualIn);
}

// One fused call as the pattern rules see it: no element type, no pattern type, so the checks below are compiled
// once per platform, not once per pattern and element type.
struct CallView {
  const PatternTraits* traits;
  std::size_t elem_bytes;
  std::string_view dtype;
  int num_tokens;
  int hidden_dim;
  int arch;
  int rank;
  float eps;
  float weight_bias;
  float routed_scaling_factor;
  TensorShape shape;
  const void* tensors[kFusedTensorCount];
};

// The group sizes a call of per-token-group FP8 may use for elements of elem_bytes: "8, 16, 32, 64, 128 or 256".
inline std::string group_sizes_text(std::size_t elem_bytes) {
  const int per_vec = static_cast<int>(16 / elem_bytes);
  std::string text;
  for (int vecs = 1; vecs <= algo::kMaxGroupVecs; vecs *= 2) {
    text += (vecs == 1 ? "" : vecs == algo::kMaxGroupVecs ? " or " : ", ") + std::to_string(vecs * per_vec);
  }
  return text;
}

// The pattern's rules for one call, from its row of the pattern table: the element type, the architecture and the
// hidden size it needs, its scalar parameters, every tensor it uses set (and every output it does not use null),
// aligned and on this rank's device (platform.check_pointer), and no overlap but the allowed aliases.
template <class Pf>
void validate_call_view(const CallView& c, const Pf& platform) {
  const PatternTraits& traits = *c.traits;
  // The message's opening is written only when a check fails: no string on the success path.
  auto where = [&] { return call_where(traits.name, c.rank); };
  const char* const name = traits.name;
  if (traits.needs_16bit && c.elem_bytes != 2) {
    throw std::invalid_argument(where() + "the input is " + std::string(c.dtype) + "; " + traits.feature +
                                " takes 16-bit input (half or bf16). Fix: run the all-reduce in half or bf16, or use " +
                                traits.alternative + ".");
  }
  if (traits.min_arch > 0 && c.arch < traits.min_arch) {
    throw std::invalid_argument(
        where() + traits.feature + " needs " + arch_name(traits.min_arch) + " or newer, and this workspace runs on " +
        (c.arch == 0 ? std::string("an unknown architecture (Topology::arch = 0)") : arch_name(c.arch)) +
        ". Fix: use " + traits.alternative + " on this GPU (on the host emulator, set Topology::arch to " +
        std::to_string(traits.min_arch) + " to emulate it).");
  }
  if (c.hidden_dim % traits.hidden_multiple != 0) {
    throw std::invalid_argument(where() + "hidden_dim = " + std::to_string(c.hidden_dim) + "; " + traits.feature +
                                " needs a multiple of " + std::to_string(traits.hidden_multiple) +
                                ". Fix: pad the hidden dimension to a multiple of " +
                                std::to_string(traits.hidden_multiple) + ".");
  }
  if (traits.norm && (!(c.eps >= 0.0f) || !std::isfinite(c.eps) || !std::isfinite(c.weight_bias))) {
    throw std::invalid_argument(where() + "eps = " + float_text(c.eps) +
                                ", weight_bias = " + float_text(c.weight_bias) +
                                "; allowed: a finite eps >= 0 and a finite weight_bias. Fix: pass the model's RMSNorm "
                                "epsilon and 0 (or 1 for (1 + gamma) norms).");
  }
  auto use = [&](FusedTensor t) { return traits.use[static_cast<int>(t)]; };
  if ((traits.quant == Quant::Nvfp4 || traits.quant == Quant::Mxfp8) && !is_valid(c.shape.layout)) {
    throw std::invalid_argument(where() + "ScaleLayout value " + std::to_string(static_cast<int>(c.shape.layout)) +
                                " is not a layout; allowed: swizzled128x4, linear. Fix: pass "
                                "fiar::ScaleLayout::Swizzled128x4 or Linear.");
  }
  if (traits.quant == Quant::Fp8Group) {
    if (!is_valid(c.shape.group_scale)) {
      throw std::invalid_argument(where() + "GroupScale value " +
                                  std::to_string(static_cast<int>(c.shape.group_scale)) +
                                  " is not a format; allowed: ue8m0_packed, float32. Fix: pass "
                                  "fiar::GroupScale::Ue8m0Packed or Float32.");
    }
    const int per_vec = static_cast<int>(16 / c.elem_bytes);
    const int g = c.shape.group_size;
    const int vecs = g > 0 && g % per_vec == 0 ? g / per_vec : 0;
    if (vecs < 1 || vecs > algo::kMaxGroupVecs || (vecs & (vecs - 1)) != 0 || c.hidden_dim % g != 0) {
      throw std::invalid_argument(where() + "group_size = " + std::to_string(g) + " for " + std::string(c.dtype) +
                                  " with hidden_dim = " + std::to_string(c.hidden_dim) +
                                  "; allowed: " + group_sizes_text(c.elem_bytes) +
                                  " elements (a power-of-two number of 16-byte vectors, at most 32) dividing "
                                  "hidden_dim. Fix: pass the GEMM's quantization group (128 for DeepGEMM).");
    }
  }
  if (traits.prologue == Prologue::MoeFinalize) {
    if (c.shape.top_k < 1 || c.shape.top_k > kMaxTopK) {
      throw std::invalid_argument(where() + "top_k = " + std::to_string(c.shape.top_k) + "; allowed: 1 to " +
                                  std::to_string(kMaxTopK) +
                                  ". Fix: pass the experts per token, the columns of expanded_idx_to_permuted_idx.");
    }
    if (c.shape.permuted_rows < 1) {
      throw std::invalid_argument(
          where() + "num_permuted_rows = " + std::to_string(c.shape.permuted_rows) +
          "; allowed: 1 or more (the rows of in, this rank's permuted expert output). Fix: pass "
          "the rows of in.");
    }
    if (!std::isfinite(c.routed_scaling_factor)) {
      throw std::invalid_argument(
          where() + "routed_scaling_factor = " + float_text(c.routed_scaling_factor) +
          "; allowed: a finite value. Fix: pass the model's routed scaling factor (1 if none).");
    }
  }
  const auto rows = static_cast<std::size_t>(c.num_tokens);
  const auto hidden = static_cast<std::size_t>(c.hidden_dim);
  auto label = [](FusedTensor t) { return kFusedTensorNames[static_cast<int>(t)]; };
  auto bytes = [&](FusedTensor t) { return tensor_bytes(t, traits, c.elem_bytes, rows, hidden, c.shape); };
  for (int i = 0; i < kFusedTensorCount; ++i) {
    const auto t = static_cast<FusedTensor>(i);
    const void* ptr = c.tensors[i];
    const TensorUse u = use(t);
    if (u == TensorUse::Required && ptr == nullptr) {
      throw std::invalid_argument(where() + label(t) + " is a null pointer; " + name + " needs it. Fix: pass it.");
    }
    if (u == TensorUse::Unused && is_output(t) && ptr != nullptr) {
      throw std::invalid_argument(where() + label(t) + " = " + pointer_text(ptr) + " is set, but " + name +
                                  " does not write it. Fix: pass nullptr, or the pattern that produces it.");
    }
    if (u == TensorUse::Unused || ptr == nullptr) continue;
    const std::size_t align = tensor_alignment(t, traits);
    if (reinterpret_cast<std::uintptr_t>(ptr) % align != 0) {
      throw std::invalid_argument(where() + label(t) + " = " + pointer_text(ptr) + " is not " + std::to_string(align) +
                                  "-byte aligned. Fix: allocate with cudaMalloc or align the tensor to " +
                                  std::to_string(align) + " bytes.");
    }
    platform.check_pointer(ptr, label(t));
  }
  // Outputs must not overlap anything, except the aliases inference engines rely on.
  for (int i = 0; i < kFusedTensorCount; ++i) {
    const auto x = static_cast<FusedTensor>(i);
    if (!is_output(x) || c.tensors[i] == nullptr || use(x) == TensorUse::Unused) continue;
    for (int j = 0; j < kFusedTensorCount; ++j) {
      const auto y = static_cast<FusedTensor>(j);
      if (i == j || c.tensors[j] == nullptr || use(y) == TensorUse::Unused || (is_output(y) && j < i)) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(c.tensors[i]);
      const auto b0 = reinterpret_cast<std::uintptr_t>(c.tensors[j]);
      const std::size_t xb = bytes(x), yb = bytes(y);
      if (!(a0 < b0 + yb && b0 < a0 + xb)) continue;
      if (a0 == b0 && xb == yb && allowed_alias(x, y, traits)) continue;
      throw std::invalid_argument(
          where() + label(x) + " (" + pointer_text(c.tensors[i]) + ", " + std::to_string(xb) + " bytes) overlaps " +
          label(y) + " (" + pointer_text(c.tensors[j]) + ", " + std::to_string(yb) + " bytes). " +
          (traits.prologue == Prologue::None
               ? "Allowed: out == in, norm_out == in, residual_out == in, residual_out == residual_in, exactly. "
                 "Fix: pass disjoint buffers or one of those aliases."
               : "Allowed: residual_out == residual_in, exactly (the MoE finalize reads rows of "
                 "in for every token: nothing may be written over them). Fix: pass disjoint "
                 "buffers."));
    }
  }
}

// validate_call_view for a call of pattern P on element type T.
template <Pattern P, ReduceType T, class Pf>
void validate_fused(const FusedArgs<T>& a, int hidden_dim, int arch, int rank, const Pf& platform) {
  CallView c{&pattern_traits(P),
             sizeof(T),
             dtype_name<T>(),
             a.num_tokens,
             hidden_dim,
             arch,
             rank,
             a.eps,
             a.weight_bias,
             a.routed_scaling_factor,
             TensorShape{a.layout, a.group_size, a.group_scale, a.top_k, a.num_permuted_rows},
             {}};
  for (int i = 0; i < kFusedTensorCount; ++i) c.tensors[i] = tensor_address(a, static_cast<FusedTensor>(i));
  validate_call_view(c, platform);
}

// A user epilogue's call: `in` as every call's (aligned, on this rank's device: the row of a pattern that reads `in`
// alone), then the epilogue's own why_not(params, num_tokens, hidden_dim) when it has one.
template <class E, ReduceType T, class Pf>
void validate_user(const T* in, int num_tokens, const typename E::template Params<T>& params, int hidden_dim, int arch,
                   int rank, const Pf& platform) {
  constexpr PatternTraits kTraits{Pattern::AllReduce,    E::name, false, Quant::None, 0, false, 1,
                                  {TensorUse::Required}, "",      ""};
  CallView c{&kTraits, sizeof(T), dtype_name<T>(), num_tokens, hidden_dim, arch, rank, 0.0f,
             0.0f,     1.0f,      TensorShape{},   {}};
  c.tensors[static_cast<int>(FusedTensor::In)] = in;
  validate_call_view(c, platform);
  if constexpr (requires { E::why_not(params, num_tokens, hidden_dim); }) {
    const std::string why = E::why_not(params, num_tokens, hidden_dim);
    if (!why.empty()) throw std::invalid_argument(call_where(E::name, rank) + why);
  }
}

/// The configuration as ranks compare it: at creation (with the strategy thresholds the backend resolved, those it
/// does not apply left out) and in WorkspacePool requests (the thresholds as given).
struct ConfigDigest {
  std::uint64_t oneshot_max_bytes = 0;  ///< meaningful when threshold_given
  std::int64_t timeout_ms = 0;
  std::int32_t max_token_num = 0;
  std::int32_t hidden_dim = 0;
  std::uint32_t threshold_given = 0;
  std::uint32_t oneshot_at_max_tokens = 0;
  std::uint32_t verify_calls = 0;
  std::uint32_t multimem_given = 0;
  std::uint64_t multimem_min_bytes = 0;  ///< meaningful when multimem_given
  std::uint32_t nccl_given = 0;
  std::uint32_t symmetric_given = 0;
  std::uint64_t nccl_min_bytes = 0;            ///< meaningful when nccl_given
  std::uint64_t nccl_symmetric_max_bytes = 0;  ///< meaningful when symmetric_given
  std::uint32_t batch_invariant = 0;

  static ConfigDigest of(const WorkspaceConfig& c) {
    ConfigDigest d;
    d.oneshot_max_bytes = c.oneshot_max_bytes.value_or(0);
    d.timeout_ms = static_cast<std::int64_t>(c.timeout.count());
    d.max_token_num = c.max_token_num;
    d.hidden_dim = c.hidden_dim;
    d.threshold_given = c.oneshot_max_bytes ? 1u : 0u;
    d.oneshot_at_max_tokens = c.oneshot_at_max_tokens ? 1u : 0u;
    d.verify_calls = c.verify_calls ? 1u : 0u;
    d.multimem_given = c.multimem_min_bytes ? 1u : 0u;
    d.multimem_min_bytes = c.multimem_min_bytes.value_or(0);
    d.nccl_given = c.nccl_min_bytes ? 1u : 0u;
    d.nccl_min_bytes = c.nccl_min_bytes.value_or(0);
    d.symmetric_given = c.nccl_symmetric_max_bytes ? 1u : 0u;
    d.nccl_symmetric_max_bytes = c.nccl_symmetric_max_bytes.value_or(0);
    d.batch_invariant = c.batch_invariant ? 1u : 0u;
    return d;
  }
  /// The thresholds a backend resolved in place of those given; `lamport`: whether it has the Lamport strategies
  /// (and the route), else only the symmetric window's bound applies and the rest is left out of the comparison.
  void resolve(const StrategyThresholds& t, bool lamport) {
    symmetric_given = 1;
    nccl_symmetric_max_bytes = t.nccl_symmetric_max_bytes;
    if (lamport) {
      // A step that is never taken is left out (and compared as absent): the same behaviour, the same record.
      threshold_given = 1;
      oneshot_max_bytes = t.oneshot_max_bytes;
      multimem_given = t.multimem_min_bytes != never ? 1u : 0u;
      multimem_min_bytes = multimem_given ? t.multimem_min_bytes : 0;
      nccl_given = t.nccl_min_bytes != never ? 1u : 0u;
      nccl_min_bytes = nccl_given ? t.nccl_min_bytes : 0;
    } else {
      threshold_given = multimem_given = nccl_given = oneshot_at_max_tokens = 0;
      oneshot_max_bytes = multimem_min_bytes = nccl_min_bytes = 0;
    }
  }
  friend bool operator==(const ConfigDigest&, const ConfigDigest&) = default;

  /// "max_token_num 16, hidden_dim 64, timeout 30000 ms, oneshot_max_bytes default, oneshot_at_max_tokens false,
  /// verify_calls true" (and each other threshold that is given or resolved).
  [[nodiscard]] std::string describe() const {
    auto bytes = [](const char* name, std::uint32_t given, std::uint64_t value) {
      if (given == 0) return std::string();
      return ", " + std::string(name) + " " + (value == never ? std::string("never") : std::to_string(value));
    };
    return "max_token_num " + std::to_string(max_token_num) + ", hidden_dim " + std::to_string(hidden_dim) +
           ", timeout " + std::to_string(timeout_ms) + " ms, oneshot_max_bytes " +
           (threshold_given ? std::to_string(oneshot_max_bytes) : std::string("default")) + ", oneshot_at_max_tokens " +
           (oneshot_at_max_tokens ? "true" : "false") + ", verify_calls " + (verify_calls ? "true" : "false") +
           bytes("multimem_min_bytes", multimem_given, multimem_min_bytes) +
           bytes("nccl_min_bytes", nccl_given, nccl_min_bytes) +
           bytes("nccl_symmetric_max_bytes", symmetric_given, nccl_symmetric_max_bytes) +
           (batch_invariant != 0 ? ", batch_invariant true" : "");
  }
};

/// What a backend adds to the creation digest: its strategy thresholds as it resolved them, and its buffer size.
struct CreationExtras {
  std::uint64_t buffer_words = 0;
  StrategyThresholds thresholds{};  ///< resolved (strategy_thresholds)
  bool strategies = false;          ///< whether the Lamport strategies (and the route) apply
};

/// What every rank exchanges at creation.
struct CreationRecord {
  std::uint32_t backend, dtype, world_size, version_major, version_minor, version_patch;
  ConfigDigest config;
  std::uint64_t buffer_words;

  friend bool operator==(const CreationRecord&, const CreationRecord&) = default;
  [[nodiscard]] std::string describe() const {
    return "backend " + std::string(to_string(static_cast<Backend>(backend))) + ", dtype " +
           std::string(dtype_name(dtype)) + ", world_size " + std::to_string(world_size) + ", " + config.describe() +
           ", fiar " + std::to_string(version_major) + "." + std::to_string(version_minor) + "." +
           std::to_string(version_patch);
  }
};

/// Collective: every rank checks the topology, its match with the bootstrap and the configuration (config_error(),
/// then creation_error(), both "" when fine; each called only when what comes before passed), then all agree: either
/// every rank returns the agreed extras, or every rank throws the same std::invalid_argument (a rank's objection, or
/// configurations that differ).
template <class Policy, ReduceType T, Bootstrap B, class ConfigError, class CreationError, class Extras>
CreationExtras agree_on_creation(B& boot, const Topology& topo, const WorkspaceConfig& cfg, ConfigError&& config_error,
                                 CreationError&& creation_error, Extras&& extras) {
  std::string error = local_creation_error<Policy>(topo, boot, config_error);
  if (error.empty()) error = creation_error();
  const CreationExtras mine = error.empty() ? extras() : CreationExtras{};
  CreationRecord record{static_cast<std::uint32_t>(Policy::backend),
                        dtype_code<T>(),
                        static_cast<std::uint32_t>(topo.world_size),
                        version_major,
                        version_minor,
                        version_patch,
                        ConfigDigest::of(cfg),
                        mine.buffer_words};
  // The thresholds as resolved (a backend's values, not the defaults' absence), those it does not apply left out so
  // they cannot cause a mismatch; nothing to resolve when this rank objected (its record is not compared then).
  if (error.empty()) record.config.resolve(mine.thresholds, mine.strategies);
  const auto all = agree(boot, outcome_of(error), record, "workspace creation failed because rank {rank} rejected it");
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!(all[r] == all[0])) {
      throw std::invalid_argument("fiar: workspace configurations differ between ranks: rank 0 has {" +
                                  all[0].describe() + "}, rank " + std::to_string(r) + " has {" + all[r].describe() +
                                  "}. Fix: create the workspace with the same type, topology and WorkspaceConfig on "
                                  "every rank, with the same fiar version.");
    }
  }
  return mine;
}

}  // namespace detail
FIAR_END_NAMESPACE
