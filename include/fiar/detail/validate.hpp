// fiar/detail/validate.hpp — the checks every backend runs on a fused call before launching anything.
// Contract: a call whose tensors do not fit the pattern (missing, unused-but-set, misaligned, on the wrong
// device, overlapping other than the allowed aliases) or whose parameters are out of range throws
// std::invalid_argument naming the value, the rule and the fix; nothing is launched.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../algo/epilogue.hpp"
#include "../algo/quant.hpp"
#include "../bootstrap.hpp"
#include "../dtype.hpp"
#include "../resolve.hpp"
#include "../topology.hpp"
#include "../version.hpp"
#include "../workspace.hpp"

namespace fiar::inline v0_1::detail {

// An address as text, for messages.
inline std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// One tensor of a call: its name, address, bytes, alignment, and whether it is written.
struct Tensor {
  const char* name;
  const void* ptr;
  std::size_t bytes;
  std::size_t align;
  bool output;
};

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

// A workspace's why_not(topo, cfg): "" when Policy's backend can run on `topo` and config_error() (the backend's
// checks of the configuration) is "", else the first reason.
template <class Policy, class F>
std::string why_not_text(const Topology& topo, F&& config_error) {
  if (!can_run_on(Policy::backend, topo)) {
    try {
      check_topology<Policy>(topo);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  }
  return config_error();
}

// A workspace's can_implement(topo, cfg): a well-formed topology (why_not() is not asked otherwise) and an empty
// why_not().
template <class F>
bool implementable(const Topology& topo, F&& why_not) {
  try {
    validate_topology(topo);
  } catch (const std::invalid_argument&) {
    return false;
  }
  return why_not().empty();
}

// This rank's objection to creating a workspace of Policy ("" when none): the topology, its match with the
// bootstrap, then config_error(), the backend's checks of the configuration (run only when the rest passed).
template <class Policy, Bootstrap B, class F>
std::string local_creation_error(const Topology& topo, B& boot, F&& config_error) {
  try {
    check_topology<Policy>(topo);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (topo.world_size != boot.size() || topo.rank != boot.rank()) {
    return "fiar: the topology says world_size " + std::to_string(topo.world_size) + ", rank " +
           std::to_string(topo.rank) + ", but the bootstrap says size " + std::to_string(boot.size()) + ", rank " +
           std::to_string(boot.rank()) +
           ". Fix: discover the topology over the same bootstrap (discover_topology(boot)).";
  }
  return config_error();
}

// "fiar: <pattern> on rank <rank>: ", the start of every message about a call.
inline std::string call_where(Pattern pattern, int rank) {
  return "fiar: " + std::string(to_string(pattern)) + " on rank " + std::to_string(rank) + ": ";
}

// The call-level checks every backend runs before its own (strategy) and the pattern's (validate_fused): `in`
// set, `out` too for a plain all-reduce, and 1 <= num_tokens <= max_token_num. `where` is call_where()'s.
inline void validate_call_basics(const std::string& where, Pattern pattern, const void* in, const void* out,
                                 int num_tokens, int max_token_num) {
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

template <Pattern P, ReduceType T, class Platform>
void validate_fused(const FusedArgs<T>& a, int hidden_dim, int arch, int rank, const Platform& platform) {
  const std::string where = call_where(P, rank);
  const std::size_t rows = static_cast<std::size_t>(a.num_tokens);
  const std::size_t hidden = static_cast<std::size_t>(hidden_dim);
  const std::size_t act = rows * hidden * sizeof(T);
  constexpr bool norm = P != Pattern::AllReduce;
  constexpr bool fp8 = P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic;
  constexpr bool nvfp4 = P == Pattern::ResidualRmsNormNvfp4;
  if constexpr (nvfp4) {
    if (sizeof(T) != 2) {
      throw std::invalid_argument(where + "the input is float; NVFP4 takes 16-bit input (half or bf16). Fix: "
                                  "run the all-reduce in half or bf16, or use residual_rmsnorm_fp8.");
    }
    if (arch < 100) {
      throw std::invalid_argument(where + "NVFP4 needs sm_100 or newer, and this workspace runs on " +
                                  arch_name(arch) +
                                  ". Fix: use residual_rmsnorm_fp8 or _fp8_dynamic on this GPU (on the host "
                                  "emulator, set Topology::arch to 100 to emulate Blackwell).");
    }
    if (hidden_dim % algo::kNvfp4Block != 0) {
      throw std::invalid_argument(where + "hidden_dim = " + std::to_string(hidden_dim) +
                                  "; NVFP4 needs a multiple of 16 (one e4m3 scale per 16 elements). Fix: pad "
                                  "the hidden dimension to a multiple of 16.");
    }
  }
  if constexpr (norm) {
    if (!(a.eps >= 0.0f) || !std::isfinite(a.eps) || !std::isfinite(a.weight_bias)) {
      throw std::invalid_argument(where + "eps = " + std::to_string(a.eps) + ", weight_bias = " +
                                  std::to_string(a.weight_bias) +
                                  "; allowed: a finite eps >= 0 and a finite weight_bias. Fix: pass the model's "
                                  "RMSNorm epsilon and 0 (or 1 for (1 + gamma) norms).");
    }
  }
  // Every tensor: required by the pattern (must be set) or unused (an output must then be null).
  const std::size_t quant_bytes = nvfp4 ? rows * hidden / 2 : rows * hidden;
  const Tensor tensors[] = {
      {"in", a.in, act, 16, false},
      {"out", a.out, act, 16, true},
      {"residual_in", a.residual_in, act, 16, false},
      {"residual_out", a.residual_out, act, 16, true},
      {"gamma", a.gamma, hidden * sizeof(T), 16, false},
      {"norm_out", a.norm_out, act, 16, true},
      {"quant_out", a.quant_out, quant_bytes, 16, true},
      {"scale", a.scale, sizeof(float), alignof(float), false},
      {"scale_out", a.scale_out, rows * sizeof(float), alignof(float), true},
      {"block_scale_out", a.block_scale_out, algo::nvfp4_scale_bytes(a.num_tokens, hidden_dim, a.layout), 1, true},
  };
  auto used = [&](std::string_view name) -> int {  // 2 required, 1 optional, 0 unused
    if (name == "in") return 2;
    if (name == "out") return P == Pattern::AllReduce ? 2 : 0;
    if (name == "residual_in" || name == "residual_out" || name == "gamma") return norm ? 2 : 0;
    if (name == "norm_out") return P == Pattern::ResidualRmsNorm ? 2 : (norm ? 1 : 0);
    if (name == "quant_out") return fp8 || nvfp4 ? 2 : 0;
    if (name == "scale") return P == Pattern::ResidualRmsNormFp8 || nvfp4 ? 2 : 0;
    if (name == "scale_out") return P == Pattern::ResidualRmsNormFp8Dynamic ? 2 : 0;
    return nvfp4 ? 2 : 0;  // block_scale_out
  };
  for (const Tensor& t : tensors) {
    const int u = used(t.name);
    if (u == 2 && t.ptr == nullptr) {
      throw std::invalid_argument(where + t.name + " is a null pointer; " + to_string(P) + " needs it. Fix: pass it.");
    }
    if (u == 0 && t.output && t.ptr != nullptr) {
      throw std::invalid_argument(where + t.name + " = " + pointer_text(t.ptr) + " is set, but " + to_string(P) +
                                  " does not write it. Fix: pass nullptr, or the pattern that produces it.");
    }
    if (u == 0 || t.ptr == nullptr) continue;
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % t.align != 0) {
      throw std::invalid_argument(where + t.name + " = " + pointer_text(t.ptr) + " is not " + std::to_string(t.align) +
                                  "-byte aligned. Fix: allocate with cudaMalloc or align the tensor to " +
                                  std::to_string(t.align) + " bytes.");
    }
    platform.check_pointer(t.ptr, t.name);
  }
  // Outputs must not overlap anything, except the aliases inference engines rely on.
  auto allowed_alias = [](std::string_view x, std::string_view y) {
    auto pair = [&](std::string_view a, std::string_view b) { return (x == a && y == b) || (x == b && y == a); };
    return pair("out", "in") || pair("norm_out", "in") || pair("residual_out", "residual_in");
  };
  for (const Tensor& x : tensors) {
    if (!x.output || x.ptr == nullptr || used(x.name) == 0) continue;
    for (const Tensor& y : tensors) {
      if (&x == &y || y.ptr == nullptr || used(y.name) == 0 || (y.output && &y < &x)) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(x.ptr);
      const auto b0 = reinterpret_cast<std::uintptr_t>(y.ptr);
      if (!(a0 < b0 + y.bytes && b0 < a0 + x.bytes)) continue;
      if (a0 == b0 && x.bytes == y.bytes && allowed_alias(x.name, y.name)) continue;
      throw std::invalid_argument(where + x.name + " (" + pointer_text(x.ptr) + ", " + std::to_string(x.bytes) +
                                  " bytes) overlaps " + y.name + " (" + pointer_text(y.ptr) + ", " +
                                  std::to_string(y.bytes) +
                                  " bytes). Allowed: out == in, norm_out == in, residual_out == residual_in, "
                                  "exactly. Fix: pass disjoint buffers or one of those aliases.");
    }
  }
}


}  // namespace fiar::inline v0_1::detail
