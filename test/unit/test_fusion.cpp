// SPDX-License-Identifier: Apache-2.0
// Fused epilogues on the host emulator (trtllm): residual add + RMSNorm, static and dynamic FP8, NVFP4 (swizzled
// and linear scales) at model hidden sizes, against the plain C++ reference of test/common/fusion_reference.hpp (fp64
// where the kernel's reduction order is free). test/gpu/test_gpu_fusion.cpp runs the same checks on real GPUs; what
// every backend does with fused calls (aliasing, validation) is tested once for all in test_backends.cpp.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cstdint>
#include <cstring>
#include <random>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"

using fiar::Pattern;
using fiar::Strategy;
using fiar_test::run_and_check;
using fiar_test::Shape;

// A trtllm workspace on the emulator (clusters of 2 blocks of 8 lanes) for calls of up to `tokens` x `hidden`, with
// the NCCL route from that size when `strategy` is Nccl.
template <class T>
fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform> fused_workspace(fiar::InProcessBootstrap& boot, int world,
                                                                           int rank, int tokens, int hidden,
                                                                           Strategy strategy) {
  fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
  if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = static_cast<std::size_t>(tokens) * hidden * sizeof(T);
  return fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform>(
      boot, fiar_test::one_node(world, rank, fiar_test::kFusedArch), cfg,
      fiar::HostPlatformOptions{.blocks = 2, .lanes = 8, .cluster = 2});
}

TEMPLATE_TEST_CASE("every pattern x world size x hidden size matches the reference", "[fusion]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(from_range(fiar_test::sizes_for({2, 4, 8}, {2, 4})));
  // 2048, 7168, 8192, and an odd multiple of the vector width (and of 16 elements, for NVFP4).
  const int hidden = GENERATE(from_range(fiar_test::sizes_for({2048, 7168, 8192, 16 * 19}, {2048, 16 * 19})));
  const Shape s{world, 3, hidden};
  const Strategy strategy = world == 4 ? Strategy::TwoShot : Strategy::OneShot;
  run_and_check<Pattern::AllReduce, TestType>(s, strategy, false);
  run_and_check<Pattern::ResidualRmsNorm, TestType>(s, strategy, true);
  run_and_check<Pattern::RmsNorm, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormPrePost, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8Group, TestType>(s, strategy, true);
  if (hidden % 32 == 0) run_and_check<Pattern::ResidualRmsNormMxfp8, TestType>(s, strategy, true);
  if constexpr (sizeof(TestType) == 2) run_and_check<Pattern::ResidualRmsNormNvfp4, TestType>(s, strategy, true);
}

// The norm's mean is fp32(fp64(ss) x fp64(1 / H)) on both machines (no division routine in the kernels); docs/design.md
// promises that it is the IEEE fp32 quotient ss / H for every normal quotient and H up to 2^17. Checked here for every
// H to 1024 and a stride beyond, on random sums of squares and on sums whose quotient is exact (mantissa a multiple
// of H), against the plain fp32 division.
TEST_CASE("the norm's mean, fp64 ss x (1 / H), is the fp32 quotient ss / H", "[fusion]") {
  std::mt19937 rng(7);
  int checked = 0, differing = 0;
  for (int h = 1; h <= 131072; h += h < 1024 ? 1 : 97) {
    const double inv = 1.0 / static_cast<double>(h);
    for (int k = 0; k < 48; ++k) {
      std::uint32_t mantissa = rng() & 0x7fffffu;
      if (k % 3 == 0) {  // ss / H exact: (2^23 + mantissa) a multiple of H's odd part
        int odd = h;
        while (odd % 2 == 0) odd /= 2;
        const std::uint32_t full =
            (0x800000u + mantissa) / static_cast<std::uint32_t>(odd) * static_cast<std::uint32_t>(odd);
        if (full < 0x800000u) continue;
        mantissa = full - 0x800000u;
      }
      const std::uint32_t exponent = 27u + rng() % 200u;  // 2^-100 .. 2^100: the quotient stays normal
      const std::uint32_t bits = exponent << 23 | mantissa;
      float ss;
      std::memcpy(&ss, &bits, sizeof(ss));
      const float got = fiar::algo::detail::norm_mean(ss, inv), want = ss / static_cast<float>(h);
      ++checked;
      if (std::memcmp(&got, &want, sizeof(got)) != 0 && differing++ < 5) {
        UNSCOPED_INFO("H " << h << ", ss " << ss << ": " << got << " instead of " << want);
      }
    }
  }
  CAPTURE(checked);
  CHECK(checked > 100000);
  CHECK(differing == 0);
}

TEST_CASE("Gemma-style (1 + gamma) norms, both strategies, with and without norm_out", "[fusion]") {
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const bool with_norm = GENERATE(true, false);
  run_and_check<Pattern::ResidualRmsNorm, __nv_bfloat16>({4, 5, 512}, strategy, true, {}, 1.0f);
  run_and_check<Pattern::ResidualRmsNormFp8, __half>({4, 5, 512}, strategy, with_norm, {}, 1.0f, 0.02f);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, __nv_bfloat16>({4, 5, 512}, strategy, with_norm, {}, 1.0f);
  run_and_check<Pattern::ResidualRmsNormNvfp4, __nv_bfloat16>({4, 5, 512}, strategy, with_norm, {}, 1.0f,
                                                              448.0f * 6.0f / 8.0f);
}

TEST_CASE("NVFP4: token counts around 128 (row padding) and both scale layouts", "[fusion]") {
  const int tokens = GENERATE(1, 127, 128, 130);
  const auto layout = GENERATE(fiar::ScaleLayout::Swizzled128x4, fiar::ScaleLayout::Linear);
  run_and_check<Pattern::ResidualRmsNormNvfp4, __half>({2, tokens, 80}, Strategy::Auto, true, layout, 0.0f, 336.0f);
}

// Per-token-group FP8 with every group size a call may use (1 to 32 vectors: on the emulator's 16-lane clusters a
// group of 32 spans two of a lane's rounds), both scale formats, token counts around the 4-row padding, and 6 groups
// per token (the packed format's last pack half full): bit for bit against the reference with norm_out, and the same
// codes and scales without it.
TEMPLATE_TEST_CASE("residual_rmsnorm_fp8_group: every group size, both formats, padding rows and packs", "[fusion]",
                   float, __nv_bfloat16) {
  using T = TestType;
  const int per_vec = static_cast<int>(16 / sizeof(T));
  const int group = per_vec * GENERATE(1, 2, 4, 8, 16, 32);
  const auto format = GENERATE(fiar::GroupScale::Ue8m0Packed, fiar::GroupScale::Float32);
  const int tokens = GENERATE(1, 4, 5);
  const Shape s{3, tokens, 6 * group};
  const Strategy strategy = group / per_vec % 4 == 0 ? Strategy::TwoShot : Strategy::OneShot;
  const fiar_test::QuantOptions quant(group, format);
  CAPTURE(group, fiar::to_string(format), tokens);
  const auto with_norm =
      fiar_test::run_pattern<Pattern::ResidualRmsNormFp8Group, T>(s, strategy, true, quant, 0.0f, 1.0f, false);
  fiar_test::check_pattern<Pattern::ResidualRmsNormFp8Group, T>(s, with_norm, true, quant, 0.0f, 1.0f);
  const auto without =
      fiar_test::run_pattern<Pattern::ResidualRmsNormFp8Group, T>(s, strategy, false, quant, 0.0f, 1.0f, false);
  fiar_test::check_pattern<Pattern::ResidualRmsNormFp8Group, T>(s, without, false, quant, 0.0f, 1.0f);
  CHECK(without[0].quant == with_norm[0].quant);
  CHECK(without[0].block_scales == with_norm[0].block_scales);
}

// MXFP8: token counts around 128 (the swizzled layout's row padding), both layouts, 36 blocks per row (column
// padding: 36 -> 36, and 33 via hidden 1056), with and without norm_out (the same codes and scales either way).
TEMPLATE_TEST_CASE("residual_rmsnorm_mxfp8: row and column padding, both layouts, with and without norm_out",
                   "[fusion]", float, __nv_bfloat16) {
  using T = TestType;
  const int tokens = GENERATE(1, 127, 130);
  const int hidden = GENERATE(1152, 1056);
  const auto layout = GENERATE(fiar::ScaleLayout::Swizzled128x4, fiar::ScaleLayout::Linear);
  const Shape s{2, tokens, hidden};
  CAPTURE(tokens, hidden, fiar::to_string(layout));
  const auto with_norm =
      fiar_test::run_pattern<Pattern::ResidualRmsNormMxfp8, T>(s, Strategy::Auto, true, layout, 1.0f, 1.0f, false);
  fiar_test::check_pattern<Pattern::ResidualRmsNormMxfp8, T>(s, with_norm, true, layout, 1.0f, 1.0f);
  const auto without =
      fiar_test::run_pattern<Pattern::ResidualRmsNormMxfp8, T>(s, Strategy::Auto, false, layout, 1.0f, 1.0f, false);
  fiar_test::check_pattern<Pattern::ResidualRmsNormMxfp8, T>(s, without, false, layout, 1.0f, 1.0f);
  CHECK(without[0].quant == with_norm[0].quant);
  CHECK(without[0].block_scales == with_norm[0].block_scales);
}

// The block patterns need whole blocks per row: MXFP8 32 elements, NVFP4 16 (a bf16 workspace of hidden 48 and 24).
TEST_CASE("mxfp8 and nvfp4: a hidden size of partial blocks is rejected naming the multiple", "[fusion]") {
  using T = __nv_bfloat16;
  std::vector<std::string> messages(2);
  auto errors = fiar_test::run_ranks(1, [&](int, fiar::InProcessBootstrap& boot) {
    for (int i = 0; i < 2; ++i) {
      const int hidden = i == 0 ? 48 : 24;
      fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform> ws(
          boot, fiar_test::one_node(1, 0, fiar_test::kFusedArch), {.max_token_num = 1, .hidden_dim = hidden});
      std::vector<T> x(static_cast<std::size_t>(hidden)), r(x.size()), ro(x.size());
      std::vector<std::uint8_t> q(x.size()), sf(512);
      const float scale = 1.0f;
      const fiar::FusedArgs<T> a{.in = x.data(),
                                 .num_tokens = 1,
                                 .residual_in = r.data(),
                                 .residual_out = ro.data(),
                                 .gamma = x.data(),
                                 .quant_out = q.data(),
                                 .scale = i == 0 ? nullptr : &scale,
                                 .block_scale_out = sf.data()};
      try {
        if (i == 0) {
          ws.run<Pattern::ResidualRmsNormMxfp8>(a);
        } else {
          ws.run<Pattern::ResidualRmsNormNvfp4>(a);
        }
      } catch (const std::invalid_argument& e) {
        messages[static_cast<std::size_t>(i)] = e.what();
      }
    }
  });
  fiar_test::require_no_errors(errors);
  CHECK_THAT(messages[0], Catch::Contains("hidden_dim = 48; MXFP8 needs a multiple of 32"));
  CHECK_THAT(messages[1], Catch::Contains("hidden_dim = 24; NVFP4 needs a multiple of 16"));
}

// An all-zero block (here every row: zero inputs and residual) gets a zero scale byte and zero codes, in both
// quantized group formats (MXFP8's e8m0 byte 0; the FP8 groups' floor 2^-33, exponent byte 94).
TEST_CASE("mxfp8 and fp8 groups: all-zero rows give zero codes and the floor scale", "[fusion]") {
  using T = __nv_bfloat16;
  const int world = 2, tokens = 3, hidden = 256;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<int> wrong(world, -1);
  auto errors = fiar_test::run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform> ws(
        boot, fiar_test::one_node(world, rank, fiar_test::kFusedArch), {.max_token_num = tokens, .hidden_dim = hidden},
        fiar::HostPlatformOptions{.blocks = 2, .lanes = 8, .cluster = 2});
    const std::vector<T> zeros(count, fiar_test::from_float<T>(0.0f)), gamma = fiar_test::gamma_of<T>(hidden);
    std::vector<T> residual_out(count);
    std::vector<std::uint8_t> q(count, 0xAA),
        mx(fiar::algo::mxfp8_scale_bytes(tokens, hidden, fiar::ScaleLayout::Linear), 0xAA),
        groups(fiar::algo::fp8_group_scale_bytes(tokens, hidden, 128, fiar::GroupScale::Ue8m0Packed), 0xAA);
    fiar::FusedArgs<T> a{.in = zeros.data(),
                         .num_tokens = tokens,
                         .residual_in = zeros.data(),
                         .residual_out = residual_out.data(),
                         .gamma = gamma.data(),
                         .quant_out = q.data(),
                         .block_scale_out = mx.data(),
                         .layout = fiar::ScaleLayout::Linear};
    ws.run<Pattern::ResidualRmsNormMxfp8>(a);
    int w = 0;
    for (std::uint8_t b : q) w += b != 0;
    for (std::uint8_t b : mx) w += b != 0;
    std::fill(q.begin(), q.end(), 0xAA);
    a.block_scale_out = groups.data();
    ws.run<Pattern::ResidualRmsNormFp8Group>(a);
    for (std::uint8_t b : q) w += b != 0;
    for (int t = 0; t < tokens; ++t) {  // 2 groups: bytes 0 and 1 of the one packed column, 2 and 3 zero
      for (int j = 0; j < 4; ++j) w += groups[4 * static_cast<std::size_t>(t) + j] != (j < 2 ? 94 : 0);
    }
    wrong[static_cast<std::size_t>(rank)] = w;
  });
  fiar_test::require_no_errors(errors);
  for (int w : wrong) CHECK(w == 0);
}

// The MoE finalize before the all-reduce: top_k 1, 6, 8 (one batch of loads) and 10 (two), -1 holes and padding rows
// in every rank's permuted output, with and without the shared expert, a routed scaling factor, every strategy:
// the sum bit for bit against each rank's contribution restated (fp32 fma in k order, one rounding), the norm
// within its bound.
TEMPLATE_TEST_CASE("moe finalize: top_k, shared expert, scaling factor, every strategy", "[fusion][moe]", float,
                   __nv_bfloat16) {
  const int top_k = GENERATE(1, 6, 8, 10);
  const bool shared = GENERATE(true, false);
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Nccl);
  const Shape s{3, 5, 16 * 19};
  const auto q = fiar_test::QuantOptions::moe(top_k, shared, top_k == 6 ? 2.5f : 1.0f);
  CAPTURE(top_k, shared, fiar::to_string(strategy));
  run_and_check<Pattern::MoeFinalizeAllReduce, TestType>(s, strategy, false, q);
  run_and_check<Pattern::MoeFinalizeResidualRmsNorm, TestType>(s, strategy, top_k != 8, q);
}

// An index outside [-1, num_permuted_rows) is never read: the call treats it as -1 (the output is the sum without that
// expert, bit for bit) and check() then throws std::invalid_argument naming it, once; the next call is clean. On one
// rank of two, on every strategy.
TEST_CASE("moe finalize: a bad index is skipped and reported by check(), once", "[fusion][moe]") {
  using T = __nv_bfloat16;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Nccl);
  CAPTURE(fiar::to_string(strategy));
  const int world = 2, tokens = 3, hidden = 64, top_k = 4;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<std::string> first(world), second(world);
  std::vector<int> differing(world, -1);
  auto errors = fiar_test::run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    auto ws = fused_workspace<T>(boot, world, rank, tokens, hidden, strategy);
    const auto q = fiar_test::QuantOptions::moe(top_k, false);
    fiar_test::MoeInputs<T> m = fiar_test::moe_inputs<T>(tokens, hidden, rank, q);
    std::vector<int> bad = m.idx, skipped = m.idx;
    if (rank == 1) {
      bad[1 * top_k + 2] = m.rows + 1000000;  // token 1, expert 2: far past the rows
      skipped[1 * top_k + 2] = -1;
    }
    std::vector<T> out_bad(count), out_skipped(count);
    fiar::FusedArgs<T> a{.in = m.in.data(), .num_tokens = tokens, .out = out_bad.data()};
    a.expanded_idx_to_permuted_idx = bad.data();
    a.expert_scale = m.scale.data();
    a.top_k = top_k;
    a.num_permuted_rows = m.rows;
    ws.run<Pattern::MoeFinalizeAllReduce>(a, nullptr, strategy);
    try {
      ws.check();
    } catch (const std::invalid_argument& e) {
      first[static_cast<std::size_t>(rank)] = e.what();
    }
    a.expanded_idx_to_permuted_idx = skipped.data();
    a.out = out_skipped.data();
    ws.run<Pattern::MoeFinalizeAllReduce>(a, nullptr, strategy);
    try {
      ws.check();
    } catch (const std::invalid_argument& e) {
      second[static_cast<std::size_t>(rank)] = e.what();
    }
    int d = 0;
    for (std::size_t i = 0; i < count; ++i) d += fiar_test::bits(out_bad[i]) != fiar_test::bits(out_skipped[i]);
    differing[static_cast<std::size_t>(rank)] = d;
  });
  fiar_test::require_no_errors(errors);
  CHECK(first[0].empty());
  CHECK_THAT(first[1], Catch::Contains("a MoE finalize call on rank 1: expanded_idx_to_permuted_idx[1][2] = 1000015; "
                                       "allowed: -1 (no expert) or 0 to num_permuted_rows - 1 = 14."));
  CHECK(second[0].empty());
  CHECK(second[1].empty());
  for (int d : differing) CHECK(d == 0);
}

// RmsNorm's math is ResidualRmsNorm's with a zero residual (T(sum + 0) is the sum: no element of it is -0), so its
// norm_out must be the same bits, on every strategy and in place or not (its y staged in norm_out when a lane owns
// several vectors: hidden 16 x 19 over 8 lanes).
TEST_CASE("rmsnorm: norm_out is residual_rmsnorm's with a zero residual, bit for bit", "[fusion]") {
  using T = __nv_bfloat16;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Nccl);
  const bool in_place = GENERATE(false, true);
  CAPTURE(fiar::to_string(strategy), in_place);
  const int world = 3, tokens = 5, hidden = 16 * 19;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<int> differing(world, -1);
  auto errors = fiar_test::run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    auto ws = fused_workspace<T>(boot, world, rank, tokens, hidden, strategy);
    const std::vector<T> in = fiar_test::make_input<T>(count, rank, 0, false);
    const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
    std::vector<T> zeros(count, fiar_test::from_float<T>(0.0f)), residual_out(count), with_residual(count);
    std::vector<T> x = in, alone(count);
    fiar::FusedArgs<T> a{.in = x.data(),
                         .num_tokens = tokens,
                         .gamma = gamma.data(),
                         .eps = 1e-5f,
                         .norm_out = in_place ? x.data() : alone.data()};
    ws.run<Pattern::RmsNorm>(a, nullptr, strategy);
    if (in_place) alone = x;
    fiar::FusedArgs<T> b{.in = in.data(),
                         .num_tokens = tokens,
                         .residual_in = zeros.data(),
                         .residual_out = residual_out.data(),
                         .gamma = gamma.data(),
                         .eps = 1e-5f,
                         .norm_out = with_residual.data()};
    ws.run<Pattern::ResidualRmsNorm>(b, nullptr, strategy);
    int d = 0;
    for (std::size_t i = 0; i < count; ++i) d += fiar_test::bits(alone[i]) != fiar_test::bits(with_residual[i]);
    differing[static_cast<std::size_t>(rank)] = d;
  });
  fiar_test::require_no_errors(errors);
  for (int d : differing) CHECK(d == 0);
}

// The pre/post norm is RmsNorm (gamma_pre) of the sum followed by residual_rmsnorm of that, bit for bit: each rank
// recomputes it from the group's sum with both patterns on a workspace of its own (one rank: the all-reduce is the
// identity) and compares residual_out and norm_out with the group's pre/post call, on every strategy.
TEST_CASE("residual_rmsnorm_prepost: rmsnorm with gamma_pre, then residual_rmsnorm, bit for bit", "[fusion]") {
  using T = __nv_bfloat16;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot, Strategy::Nccl);
  const float weight_bias = GENERATE(0.0f, 1.0f);
  CAPTURE(fiar::to_string(strategy), weight_bias);
  const int world = 3, tokens = 5, hidden = 16 * 19;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<int> differing(world, -1);
  auto errors = fiar_test::run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::HostPlatformOptions grid{.blocks = 2, .lanes = 8, .cluster = 2};
    fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
    if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = count * sizeof(T);
    fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform> ws(
        boot, fiar_test::one_node(world, rank, fiar_test::kFusedArch), cfg, grid);
    const std::vector<T> in = fiar_test::make_input<T>(count, rank, 0, false);
    const std::vector<T> residual = fiar_test::residual_of<T>(count, 0);
    const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden), gamma_pre = fiar_test::gamma_pre_of<T>(hidden);
    std::vector<T> sum(count), z(count), n(count);
    auto norm_call = [&](const T* x, const T* residual_in, T* residual_out, const T* g, T* norm) {
      return fiar::FusedArgs<T>{.in = x,
                                .num_tokens = tokens,
                                .residual_in = residual_in,
                                .residual_out = residual_out,
                                .gamma = g,
                                .eps = 1e-5f,
                                .weight_bias = weight_bias,
                                .norm_out = norm};
    };
    ws.allreduce(in.data(), sum.data(), tokens, nullptr, strategy);
    fiar::FusedArgs<T> prepost = norm_call(in.data(), residual.data(), z.data(), gamma.data(), n.data());
    prepost.gamma_pre = gamma_pre.data();
    ws.run<Pattern::ResidualRmsNormPrePost>(prepost, nullptr, strategy);
    // The same from the sum, alone.
    fiar::InProcessGroup alone(1);
    auto solo_boot = alone.bootstrap(0);
    fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform> solo(
        solo_boot, fiar_test::one_node(1, 0, fiar_test::kFusedArch), {.max_token_num = tokens, .hidden_dim = hidden},
        grid);
    std::vector<T> p(count), z1(count), n1(count);
    solo.run<Pattern::RmsNorm>(norm_call(sum.data(), nullptr, nullptr, gamma_pre.data(), p.data()));
    solo.run<Pattern::ResidualRmsNorm>(norm_call(p.data(), residual.data(), z1.data(), gamma.data(), n1.data()));
    int d = 0;
    for (std::size_t i = 0; i < count; ++i) {
      d += fiar_test::bits(z[i]) != fiar_test::bits(z1[i]);
      d += fiar_test::bits(n[i]) != fiar_test::bits(n1[i]);
    }
    differing[static_cast<std::size_t>(rank)] = d;
  });
  fiar_test::require_no_errors(errors);
  for (int d : differing) CHECK(d == 0);
}
