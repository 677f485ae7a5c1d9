// SPDX-License-Identifier: Apache-2.0
// Host-emulator harness for the fused patterns, shared by the backends' tests: runs a pattern once on every
// rank and checks it against test/common/fusion_reference.hpp (test code only).
#pragma once

#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cmath>
#include <vector>

#include "fusion_reference.hpp"
#include "host_harness.hpp"
#include "reference.hpp"

namespace fiar_test {

using fiar::Pattern;

// The architecture the fused patterns run on by default: sm_100, where NVFP4 is allowed too.
inline constexpr int kFusedArch = 100;

// Runs pattern P once on every rank (host emulator; topo_of(world, rank, arch) each) and returns each rank's
// outputs.
template <Pattern P, class T, class Policy = fiar::TrtllmPolicy>
std::vector<Outputs<T>> run_pattern(const Shape& s, Strategy strategy, bool with_norm_out, const QuantOptions& quant,
                                    float weight_bias, float scale, bool in_place, int arch = kFusedArch,
                                    TopologyOf topo_of = one_node) {
  const std::size_t count = static_cast<std::size_t>(s.tokens) * s.hidden;
  std::vector<Outputs<T>> result(static_cast<std::size_t>(s.world));
  auto errors = run_ranks(
      s.world,
      [&](int r, fiar::InProcessBootstrap& boot) {
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = s.tokens;
        cfg.hidden_dim = s.hidden;
        cfg.oneshot_at_max_tokens = true;
        // Strategy::Nccl on trtllm / mnnvl: the NCCL route, set up because the (only) call reaches its threshold.
        if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = count * sizeof(T);
        fiar::Workspace<Policy, T, fiar::HostPlatform> ws(
            boot, topo_of(s.world, r, arch), cfg, fiar::HostPlatformOptions{.blocks = 2, .lanes = 8, .cluster = 2});
        Outputs<T>& o = result[static_cast<std::size_t>(r)];
        constexpr bool kMoe = fiar::pattern_traits(P).prologue == fiar::Prologue::MoeFinalize;
        const MoeInputs<T> moe = kMoe ? moe_inputs<T>(s.tokens, s.hidden, r, quant) : MoeInputs<T>{};
        std::vector<T> in = kMoe ? moe.in : fiar_test::make_input<T>(count, r, 0, false);
        std::vector<T> residual = residual_of<T>(count, 0);
        const std::vector<T> gamma = gamma_of<T>(s.hidden), gamma_pre = gamma_pre_of<T>(s.hidden);
        const float scale_value = scale;
        fiar::FusedArgs<T> a;
        a.in = in.data();
        a.num_tokens = s.tokens;
        if constexpr (kMoe) {
          a.expanded_idx_to_permuted_idx = moe.idx.data();
          a.expert_scale = moe.scale.data();
          if (quant.shared) a.shared_expert_out = moe.shared.data();
          a.top_k = quant.top_k;
          a.num_permuted_rows = moe.rows;
          a.routed_scaling_factor = quant.routed_scaling_factor;
        }
        if constexpr (!fiar::pattern_traits(P).norm) {
          o.out.resize(count);
          a.out = in_place && !kMoe ? in.data() : o.out.data();
        } else {
          if constexpr (uses<P>(fiar::FusedTensor::ResidualIn)) {
            o.residual_out.resize(count);
            a.residual_in = residual.data();
            a.residual_out = in_place ? residual.data() : o.residual_out.data();
          }
          a.gamma = gamma.data();
          a.eps = 1e-5f;
          a.weight_bias = weight_bias;
          if constexpr (uses<P>(fiar::FusedTensor::GammaPre)) a.gamma_pre = gamma_pre.data();
          if (with_norm_out || requires_tensor<P>(fiar::FusedTensor::NormOut)) {
            o.norm_out.resize(count);
            a.norm_out = in_place && !kMoe ? in.data() : o.norm_out.data();
          }
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8Group) {
          o.quant.assign(count, 0xAA);
          a.quant_out = o.quant.data();
          a.group_size = group_size_for<T>(quant, s.hidden);
          a.group_scale = quant.group_scale;
          o.block_scales.assign(fiar::algo::fp8_group_scale_bytes(s.tokens, s.hidden, a.group_size, a.group_scale),
                                0xAA);
          a.block_scale_out = o.block_scales.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic) {
          o.quant.assign(count, 0xAA);
          a.quant_out = o.quant.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormNvfp4) a.scale = &scale_value;
        if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) {
          o.scale_out.assign(static_cast<std::size_t>(s.tokens), -1.0f);
          a.scale_out = o.scale_out.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormMxfp8) {
          o.quant.assign(count, 0xAA);
          a.quant_out = o.quant.data();
          o.block_scales.assign(fiar::algo::mxfp8_scale_bytes(s.tokens, s.hidden, quant.layout), 0xAA);
          a.block_scale_out = o.block_scales.data();
          a.layout = quant.layout;
        }
        if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
          o.quant.assign(count / 2, 0xAA);
          a.quant_out = o.quant.data();
          o.block_scales.assign(fiar::algo::nvfp4_scale_bytes(s.tokens, s.hidden, quant.layout), 0xAA);
          a.block_scale_out = o.block_scales.data();
          a.layout = quant.layout;
        }
        ws.template run<P>(a, nullptr, strategy);
        if (in_place) {
          if constexpr (!fiar::pattern_traits(P).norm) {
            if (!kMoe) o.out = in;
          } else {
            if constexpr (uses<P>(fiar::FusedTensor::ResidualOut)) o.residual_out = residual;
            if (!o.norm_out.empty() && !kMoe) o.norm_out = in;
          }
        }
      },
      60s);
  require_no_errors(errors);
  return result;
}

// Runs pattern P (run_pattern) and checks every rank's outputs against the reference.
template <Pattern P, class T, class Policy = fiar::TrtllmPolicy>
void run_and_check(const Shape& s, Strategy strategy, bool with_norm_out, const QuantOptions& quant = {},
                   float weight_bias = 0.0f, float scale = 0.75f, bool in_place = false,
                   TopologyOf topo_of = one_node) {
  CAPTURE(fiar::to_string(P), fiar_test::dtype_label<T>(), s.world, s.tokens, s.hidden, fiar::to_string(strategy),
          with_norm_out, weight_bias, in_place, group_size_for<T>(quant, s.hidden), fiar::to_string(quant.group_scale));
  const auto outs =
      run_pattern<P, T, Policy>(s, strategy, with_norm_out, quant, weight_bias, scale, in_place, kFusedArch, topo_of);
  check_pattern<P, T>(s, outs, with_norm_out, quant, weight_bias, scale);
}

}  // namespace fiar_test
