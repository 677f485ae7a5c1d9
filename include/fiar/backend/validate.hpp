// SPDX-License-Identifier: Apache-2.0
// fiar/backend/validate.hpp — the checks every backend runs before creating a workspace or launching a call,
// driven by the pattern table (core/pattern.hpp).
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
#include "../comm/bootstrap.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/strategy.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"

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
// the bootstrap, then `config_error` (the backend's checks of the configuration).
template <class Policy, Bootstrap B>
std::string local_creation_error(const Topology& topo, B& boot, const std::string& config_error) {
  if (std::string e = topology_error<Policy>(topo); !e.empty()) return e;
  if (topo.world_size != boot.size() || topo.rank != boot.rank()) {
    return "fiar: the topology says world_size " + std::to_string(topo.world_size) + ", rank " +
           std::to_string(topo.rank) + ", but the bootstrap says size " + std::to_string(boot.size()) + ", rank " +
           std::to_string(boot.rank()) +
           ". Fix: discover the topology over the same bootstrap (discover_topology(boot)).";
  }
  return config_error;
}

// "fiar: <pattern> on rank <rank>: ", the start of every message about a call.
inline std::string call_where(Pattern pattern, int rank) {
  return "fiar: " + std::string(to_string(pattern)) + " on rank " + std::to_string(rank) + ": ";
}

// The call-level checks before the backend's own (strategy) and the pattern's (validate_fused): the strategy is an
// enumerator, `in` is set, `out` too for a plain all-reduce, and 1 <= num_tokens <= max_token_num.
inline void validate_call_basics(const std::string& where, Pattern pattern, Strategy strategy, const void* in,
                                 const void* out, int num_tokens, int max_token_num) {
  if (!is_valid(strategy)) {
    throw std::invalid_argument(where + "Strategy value " + std::to_string(static_cast<int>(strategy)) +
                                " is not a strategy; allowed: auto, oneshot, twoshot. Fix: pass fiar::Strategy::Auto, "
                                "OneShot or TwoShot.");
  }
  if (in == nullptr || (pattern == Pattern::AllReduce && out == nullptr)) {
    throw std::invalid_argument(where + (in == nullptr ? "in" : "out") +
                                " is a null pointer. Fix: pass [num_tokens, hidden_dim] buffers.");
  }
  if (num_tokens < 1 || num_tokens > max_token_num) {
    throw std::invalid_argument(where + "num_tokens = " + std::to_string(num_tokens) +
                                "; allowed: 1 to max_token_num = " + std::to_string(max_token_num) +
                                ". Fix: split the call, or create the workspace with a larger max_token_num.");
  }
}

// Bytes and alignment of tensor t of a call of pattern P (rows tokens, hidden elements per row).
template <ReduceType T>
constexpr std::size_t tensor_bytes(FusedTensor t, const PatternTraits& traits, std::size_t rows, std::size_t hidden,
                                   ScaleLayout layout) {
  switch (t) {
    case FusedTensor::Gamma: return hidden * sizeof(T);
    case FusedTensor::QuantOut: return traits.quant == Quant::Nvfp4 ? rows * hidden / 2 : rows * hidden;
    case FusedTensor::Scale: return sizeof(float);
    case FusedTensor::ScaleOut: return rows * sizeof(float);
    case FusedTensor::BlockScaleOut:
      return algo::nvfp4_scale_bytes(static_cast<int>(rows), static_cast<int>(hidden),
                                     is_valid(layout) ? layout : ScaleLayout::Linear);
    default: return rows * hidden * sizeof(T);
  }
}
constexpr std::size_t tensor_alignment(FusedTensor t) {
  switch (t) {
    case FusedTensor::Scale:
    case FusedTensor::ScaleOut: return alignof(float);
    case FusedTensor::BlockScaleOut: return 1;
    default: return 16;
  }
}
constexpr bool is_output(FusedTensor t) {
  return t == FusedTensor::Out || t == FusedTensor::ResidualOut || t == FusedTensor::NormOut ||
         t == FusedTensor::QuantOut || t == FusedTensor::ScaleOut || t == FusedTensor::BlockScaleOut;
}
// The aliases inference engines rely on, each allowed only exactly (same address, same size).
constexpr bool allowed_alias(FusedTensor x, FusedTensor y) {
  auto pair = [&](FusedTensor a, FusedTensor b) { return (x == a && y == b) || (x == b && y == a); };
  return pair(FusedTensor::Out, FusedTensor::In) || pair(FusedTensor::NormOut, FusedTensor::In) ||
         pair(FusedTensor::ResidualOut, FusedTensor::ResidualIn);
}

// The pattern's rules for one call, from its row of the pattern table: the element type, the architecture and the
// hidden size it needs, its scalar parameters, every tensor it uses set (and every output it does not use null),
// aligned and on this rank's device, and no overlap but the allowed aliases.
template <Pattern P, ReduceType T, class Pf>
void validate_fused(const FusedArgs<T>& a, int hidden_dim, int arch, int rank, const Pf& platform) {
  constexpr PatternTraits traits = pattern_traits(P);
  const std::string where = call_where(P, rank);
  const std::string name = to_string(P);
  if (traits.needs_16bit && sizeof(T) != 2) {
    throw std::invalid_argument(where + "the input is " + std::string(dtype_name<T>()) + "; " + traits.feature +
                                " takes 16-bit input (half or bf16). Fix: run the all-reduce in half or bf16, or use " +
                                traits.alternative + ".");
  }
  if (traits.min_arch > 0 && arch < traits.min_arch) {
    throw std::invalid_argument(where + traits.feature + " needs " + arch_name(traits.min_arch) +
                                " or newer, and this workspace runs on " + arch_name(arch) + ". Fix: use " +
                                traits.alternative + " on this GPU (on the host emulator, set Topology::arch to " +
                                std::to_string(traits.min_arch) + " to emulate it).");
  }
  if (hidden_dim % traits.hidden_multiple != 0) {
    throw std::invalid_argument(where + "hidden_dim = " + std::to_string(hidden_dim) + "; " + traits.feature +
                                " needs a multiple of " + std::to_string(traits.hidden_multiple) +
                                ". Fix: pad the hidden dimension to a multiple of " +
                                std::to_string(traits.hidden_multiple) + ".");
  }
  if (traits.norm && (!(a.eps >= 0.0f) || !std::isfinite(a.eps) || !std::isfinite(a.weight_bias))) {
    throw std::invalid_argument(where + "eps = " + float_text(a.eps) + ", weight_bias = " + float_text(a.weight_bias) +
                                "; allowed: a finite eps >= 0 and a finite weight_bias. Fix: pass the model's RMSNorm "
                                "epsilon and 0 (or 1 for (1 + gamma) norms).");
  }
  const TensorUse used_layout = traits.use[static_cast<int>(FusedTensor::BlockScaleOut)];
  if (used_layout != TensorUse::Unused && !is_valid(a.layout)) {
    throw std::invalid_argument(where + "ScaleLayout value " + std::to_string(static_cast<int>(a.layout)) +
                                " is not a layout; allowed: swizzled128x4, linear. Fix: pass "
                                "fiar::ScaleLayout::Swizzled128x4 or Linear.");
  }
  const std::size_t rows = static_cast<std::size_t>(a.num_tokens);
  const std::size_t hidden = static_cast<std::size_t>(hidden_dim);
  struct Tensor {
    FusedTensor id;
    const void* ptr;
    std::size_t bytes;
  };
  Tensor tensors[kFusedTensorCount];
  for (int i = 0; i < kFusedTensorCount; ++i) {
    const auto t = static_cast<FusedTensor>(i);
    tensors[i] = Tensor{t, tensor_address(a, t), tensor_bytes<T>(t, traits, rows, hidden, a.layout)};
  }
  auto use = [&](FusedTensor t) { return traits.use[static_cast<int>(t)]; };
  auto label = [](FusedTensor t) { return kFusedTensorNames[static_cast<int>(t)]; };
  for (const Tensor& t : tensors) {
    const TensorUse u = use(t.id);
    if (u == TensorUse::Required && t.ptr == nullptr) {
      throw std::invalid_argument(where + label(t.id) + " is a null pointer; " + name + " needs it. Fix: pass it.");
    }
    if (u == TensorUse::Unused && is_output(t.id) && t.ptr != nullptr) {
      throw std::invalid_argument(where + label(t.id) + " = " + pointer_text(t.ptr) + " is set, but " + name +
                                  " does not write it. Fix: pass nullptr, or the pattern that produces it.");
    }
    if (u == TensorUse::Unused || t.ptr == nullptr) continue;
    const std::size_t align = tensor_alignment(t.id);
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % align != 0) {
      throw std::invalid_argument(where + label(t.id) + " = " + pointer_text(t.ptr) + " is not " +
                                  std::to_string(align) +
                                  "-byte aligned. Fix: allocate with cudaMalloc or align the "
                                  "tensor to " +
                                  std::to_string(align) + " bytes.");
    }
    platform.check_pointer(t.ptr, label(t.id));
  }
  // Outputs must not overlap anything, except the aliases inference engines rely on.
  for (const Tensor& x : tensors) {
    if (!is_output(x.id) || x.ptr == nullptr || use(x.id) == TensorUse::Unused) continue;
    for (const Tensor& y : tensors) {
      if (&x == &y || y.ptr == nullptr || use(y.id) == TensorUse::Unused || (is_output(y.id) && &y < &x)) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(x.ptr);
      const auto b0 = reinterpret_cast<std::uintptr_t>(y.ptr);
      if (!(a0 < b0 + y.bytes && b0 < a0 + x.bytes)) continue;
      if (a0 == b0 && x.bytes == y.bytes && allowed_alias(x.id, y.id)) continue;
      throw std::invalid_argument(where + label(x.id) + " (" + pointer_text(x.ptr) + ", " + std::to_string(x.bytes) +
                                  " bytes) overlaps " + label(y.id) + " (" + pointer_text(y.ptr) + ", " +
                                  std::to_string(y.bytes) +
                                  " bytes). Allowed: out == in, norm_out == in, residual_out == residual_in, exactly. "
                                  "Fix: pass disjoint buffers or one of those aliases.");
    }
  }
}

}  // namespace detail
FIAR_END_NAMESPACE
