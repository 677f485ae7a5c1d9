// SPDX-License-Identifier: Apache-2.0
// fiar/core/pattern.hpp — what a call computes after the all-reduce, as data: one row per pattern says which
// tensors it reads and writes, its quantization, and what the machine and the input must offer.
// Contract: pattern_traits(P) is the one description of a pattern; validation (every backend) and the epilogue
// (every kernel) read it, so a new pattern is a row here plus its math in algo/epilogue.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "prelude.hpp"
#include "text.hpp"

/// Calls X(args..., P) for every Pattern enumerator name (explicit instantiations are spelled with it).
#define FIAR_FOR_EACH_PATTERN(X, ...)       \
  X(__VA_ARGS__, AllReduce)                 \
  X(__VA_ARGS__, ResidualRmsNorm)           \
  X(__VA_ARGS__, ResidualRmsNormFp8)        \
  X(__VA_ARGS__, ResidualRmsNormFp8Dynamic) \
  X(__VA_ARGS__, ResidualRmsNormNvfp4)      \
  X(__VA_ARGS__, RmsNorm)                   \
  X(__VA_ARGS__, ResidualRmsNormPrePost)    \
  X(__VA_ARGS__, ResidualRmsNormFp8Group)   \
  X(__VA_ARGS__, ResidualRmsNormMxfp8)      \
  X(__VA_ARGS__, MoeFinalizeAllReduce)      \
  X(__VA_ARGS__, MoeFinalizeResidualRmsNorm)

FIAR_BEGIN_NAMESPACE

/// What a call computes after the all-reduce (FlashInfer's AllReduceFusionPattern codes 0, 1, 2/4, 10/11, 3/5, then
/// TensorRT-LLM's AllReduceFusionOp 9 for RmsNorm, 3 for ResidualRmsNormPrePost, FlashInfer's 8/9 for
/// ResidualRmsNormFp8Group, TensorRT-LLM's 11 for ResidualRmsNormMxfp8; FlashInfer's 7 / TensorRT-LLM's 8 for the MoE
/// finalize patterns).
enum class Pattern {
  AllReduce,                  ///< out = sum
  ResidualRmsNorm,            ///< residual_out = sum + residual_in; norm_out = RMSNorm(residual_out)
  ResidualRmsNormFp8,         ///< ... then quant_out = e4m3(norm / scale), static per-tensor scale
  ResidualRmsNormFp8Dynamic,  ///< ... then per-token e4m3 with scale_out[token] = max(amax / 448, 1/(512*448))
  ResidualRmsNormNvfp4,       ///< ... then NVFP4: e2m1 values in 16-element blocks, e4m3 block scales (sm_100+)
  RmsNorm,                    ///< norm_out = RMSNorm(sum): no residual in or out
  ResidualRmsNormPrePost,     ///< residual_out = RMSNorm_pre(sum) + residual_in; norm_out = RMSNorm(residual_out)
  ResidualRmsNormFp8Group,    ///< ResidualRmsNorm, then e4m3 with a power-of-two scale per group of group_size elements
  ResidualRmsNormMxfp8,       ///< ResidualRmsNorm, then MXFP8: e4m3 values in 32-element blocks, e8m0 block scales
  MoeFinalizeAllReduce,       ///< out = sum of each rank's MoE finalize (its top_k expert rows weighted, + shared)
  MoeFinalizeResidualRmsNorm,  ///< the MoE finalize, then ResidualRmsNorm
};

/// Where the NVFP4 (and MXFP8) block scales of token m, 16-element (32-element) block k go.
enum class ScaleLayout {
  Swizzled128x4,  ///< the tiled layout block-scaled GEMMs read: rows padded to 128, columns to 4
  Linear,         ///< row-major [num_tokens, hidden_dim / 16] (MXFP8: hidden_dim / 32)
};

/// How the per-token-group FP8 scales are stored (FusedArgs::group_scale), both column-major with the token rows
/// padded to a multiple of 4 (round_up(num_tokens, 4), the stride block-scaled GEMMs load with TMA).
enum class GroupScale {
  Ue8m0Packed,  ///< each scale's biased exponent byte, 4 groups per int32 (DeepGEMM on sm_100, FlashInfer's layout)
  Float32,      ///< each scale as fp32 (DeepGEMM and CUTLASS 1 x 128 on sm_90)
};

/// The quantized output a pattern writes after the norm.
enum class Quant { None, Fp8Static, Fp8Dynamic, Nvfp4, Fp8Group, Mxfp8 };

/// What a pattern computes from `in` before the all-reduce: `in` itself, or the MoE finalize (each token's top_k rows
/// of the permuted expert output in `in`, weighted by expert_scale, plus shared_expert_out).
enum class Prologue { None, MoeFinalize };

/// The most experts per token a MoE finalize call may weight (FusedArgs::top_k).
inline constexpr int kMaxTopK = 64;

/// How a pattern uses one tensor of FusedArgs: an Unused output must be null, an Unused input is ignored.
enum class TensorUse : std::uint8_t { Unused, Optional, Required };

/// The tensors of FusedArgs, in its order.
enum class FusedTensor {
  In,
  Out,
  ResidualIn,
  ResidualOut,
  Gamma,
  NormOut,
  QuantOut,
  Scale,
  ScaleOut,
  BlockScaleOut,
  GammaPre,
  ExpandedIdx,
  ExpertScale,
  SharedExpertOut
};
inline constexpr int kFusedTensorCount = 14;

/// Each tensor's name, as FusedArgs spells its member (and messages name it).
inline constexpr const char* kFusedTensorNames[kFusedTensorCount] = {"in",           "out",
                                                                     "residual_in",  "residual_out",
                                                                     "gamma",        "norm_out",
                                                                     "quant_out",    "scale",
                                                                     "scale_out",    "block_scale_out",
                                                                     "gamma_pre",    "expanded_idx_to_permuted_idx",
                                                                     "expert_scale", "shared_expert_out"};

/// One pattern, described.
struct PatternTraits {
  Pattern pattern;
  const char* name;     ///< to_string(pattern)
  bool norm;            ///< RMSNorm after the sum (after the residual add where the row uses residual_in)
  Quant quant;          ///< what is quantized after the norm
  int min_arch;         ///< lowest compute capability x10 (0: any)
  bool needs_16bit;     ///< half or bf16 input only
  int hidden_multiple;  ///< hidden_dim must be a multiple of it (beyond the 16-byte vectors every pattern needs)
  TensorUse use[kFusedTensorCount];    ///< per FusedTensor
  const char* feature;                 ///< what min_arch / needs_16bit / hidden_multiple are for, in messages ("NVFP4")
  const char* alternative;             ///< the pattern to suggest where this one cannot run
  Prologue prologue = Prologue::None;  ///< what the push phase computes from `in`
};

namespace detail {
using U = TensorUse;
// clang-format off
// One row per pattern, in enumeration order. Uses: in out residual_in/out gamma norm_out quant_out scale scale_out
// block_scale_out gamma_pre (then expanded_idx_to_permuted_idx expert_scale shared_expert_out: Unused where not
// listed)
inline constexpr PatternTraits kPatternTable[] = {
    {Pattern::AllReduce, "allreduce", false, Quant::None, 0, false, 1,
     {U::Required, U::Required, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused,
      U::Unused},
     "", ""},
    {Pattern::ResidualRmsNorm, "residual_rmsnorm", true, Quant::None, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Required, U::Unused, U::Unused, U::Unused,
      U::Unused, U::Unused},
     "", ""},
    {Pattern::ResidualRmsNormFp8, "residual_rmsnorm_fp8", true, Quant::Fp8Static, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Optional, U::Required, U::Required, U::Unused,
      U::Unused, U::Unused},
     "", ""},
    {Pattern::ResidualRmsNormFp8Dynamic, "residual_rmsnorm_fp8_dynamic", true, Quant::Fp8Dynamic, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Optional, U::Required, U::Unused, U::Required,
      U::Unused, U::Unused},
     "", ""},
    {Pattern::ResidualRmsNormNvfp4, "residual_rmsnorm_nvfp4", true, Quant::Nvfp4, 100, true, 16,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Optional, U::Required, U::Required, U::Unused,
      U::Required, U::Unused},
     "NVFP4", "residual_rmsnorm_fp8 or _fp8_dynamic"},
    {Pattern::RmsNorm, "rmsnorm", true, Quant::None, 0, false, 1,
     {U::Required, U::Unused, U::Unused, U::Unused, U::Required, U::Required, U::Unused, U::Unused, U::Unused,
      U::Unused, U::Unused},
     "", ""},
    {Pattern::ResidualRmsNormPrePost, "residual_rmsnorm_prepost", true, Quant::None, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Required, U::Unused, U::Unused, U::Unused,
      U::Unused, U::Required},
     "", ""},
    {Pattern::ResidualRmsNormFp8Group, "residual_rmsnorm_fp8_group", true, Quant::Fp8Group, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Optional, U::Required, U::Unused, U::Unused,
      U::Required, U::Unused},
     "", ""},
    {Pattern::ResidualRmsNormMxfp8, "residual_rmsnorm_mxfp8", true, Quant::Mxfp8, 0, false, 32,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Optional, U::Required, U::Unused, U::Unused,
      U::Required, U::Unused},
     "MXFP8", "residual_rmsnorm_fp8_group"},
    {Pattern::MoeFinalizeAllReduce, "moe_finalize_allreduce", false, Quant::None, 0, false, 1,
     {U::Required, U::Required, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused, U::Unused,
      U::Unused, U::Unused, U::Required, U::Required, U::Optional},
     "", "", Prologue::MoeFinalize},
    {Pattern::MoeFinalizeResidualRmsNorm, "moe_finalize_residual_rmsnorm", true, Quant::None, 0, false, 1,
     {U::Required, U::Unused, U::Required, U::Required, U::Required, U::Required, U::Unused, U::Unused, U::Unused,
      U::Unused, U::Unused, U::Required, U::Required, U::Optional},
     "", "", Prologue::MoeFinalize},
};
// clang-format on
inline constexpr int kPatternCount = static_cast<int>(std::size(kPatternTable));

constexpr bool table_in_enum_order() {
  for (int i = 0; i < kPatternCount; ++i) {
    if (static_cast<int>(kPatternTable[i].pattern) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kPatternTable rows must follow the Pattern enumeration");
}  // namespace detail

/// Whether p is one of the enumerators.
constexpr bool is_valid(Pattern p) noexcept {
  return static_cast<int>(p) >= 0 && static_cast<int>(p) < detail::kPatternCount;
}

/// The description of pattern p (p must be an enumerator).
FIAR_HD constexpr const PatternTraits& pattern_traits(Pattern p) { return detail::kPatternTable[static_cast<int>(p)]; }

/// The pattern's name as messages and tools write it ("invalid" outside the enumeration).
constexpr const char* to_string(Pattern p) {
  return is_valid(p) ? detail::kPatternTable[static_cast<int>(p)].name : "invalid";
}

/// Whether l is one of the enumerators.
constexpr bool is_valid(ScaleLayout l) noexcept { return l == ScaleLayout::Swizzled128x4 || l == ScaleLayout::Linear; }

/// "swizzled128x4" or "linear" ("invalid" outside the enumeration).
constexpr const char* to_string(ScaleLayout l) {
  return l == ScaleLayout::Swizzled128x4 ? "swizzled128x4" : l == ScaleLayout::Linear ? "linear" : "invalid";
}

/// Whether g is one of the enumerators.
constexpr bool is_valid(GroupScale g) noexcept { return g == GroupScale::Ue8m0Packed || g == GroupScale::Float32; }

/// "ue8m0_packed" or "float32" ("invalid" outside the enumeration).
constexpr const char* to_string(GroupScale g) {
  return g == GroupScale::Ue8m0Packed ? "ue8m0_packed" : g == GroupScale::Float32 ? "float32" : "invalid";
}

/// A user epilogue type E where a kernel takes its epilogue as a template argument (the place of a Pattern), as the
/// address of a tag object: TrtllmOneShot<user_epilogue<E>, T>. (A pointer, not a class-type value: nvcc's host stubs
/// spell kernels with class-type template arguments wrong.) E is described by the UserEpilogue concept
/// (algo/user_epilogue.hpp).
template <class E>
struct UserEpilogueTag {
  using type = E;
};
namespace detail {
template <class E>
inline constexpr UserEpilogueTag<E> user_epilogue_tag{};
}  // namespace detail
template <class E>
inline constexpr const UserEpilogueTag<E>* user_epilogue = &detail::user_epilogue_tag<E>;

/// E::name, the user epilogue's name in messages and launch errors.
template <class E>
constexpr const char* to_string(const UserEpilogueTag<E>*) {
  return E::name;
}

/// Whether a kernel's epilogue argument is a Pattern (false: a user epilogue, user_epilogue<E>).
template <auto E>
inline constexpr bool is_pattern_v = std::is_same_v<std::remove_cvref_t<decltype(E)>, Pattern>;

/// The user epilogue type of a kernel's epilogue argument user_epilogue<U>: U.
template <auto E>
using user_epilogue_t = typename std::remove_cvref_t<std::remove_pointer_t<decltype(E)>>::type;

/// What a kernel's epilogue argument needs and does: a pattern's row, or a user epilogue's (any architecture, no
/// prologue).
template <auto E>
constexpr int epilogue_min_arch() {
  if constexpr (is_pattern_v<E>) {
    return pattern_traits(E).min_arch;
  } else {
    return 0;
  }
}
template <auto E>
constexpr Prologue epilogue_prologue() {
  if constexpr (is_pattern_v<E>) {
    return pattern_traits(E).prologue;
  } else {
    return Prologue::None;
  }
}

/// Codes of user epilogues in a call digest (CallDigest::pattern): kUserEpilogueCode | the top 30 bits of E::name's
/// FNV-1a hash (detail::fnv1a), never a Pattern value and never the Lamport sentinel word.
inline constexpr std::uint32_t kUserEpilogueCode = 0x40000000u;

/// The call digest's code of a kernel's epilogue argument: the Pattern's value, or a user epilogue's name hashed.
template <auto E>
constexpr std::uint32_t epilogue_code() {
  if constexpr (is_pattern_v<E>) {
    return static_cast<std::uint32_t>(E);
  } else {
    return kUserEpilogueCode | static_cast<std::uint32_t>(detail::fnv1a(user_epilogue_t<E>::name) >> 34);
  }
}

FIAR_END_NAMESPACE
