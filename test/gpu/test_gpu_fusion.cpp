// SPDX-License-Identifier: Apache-2.0
// Fused epilogues on a real GPU: residual add + RMSNorm, static and dynamic FP8 and NVFP4 (sm_100+), run by
// ranks that are threads of this process sharing device 0, each with its own non-blocking stream. Every
// result goes through the same plain C++ reference as the host-emulator tests (test/unit/test_fusion.cpp,
// via test/common/fusion_reference.hpp): all ranks bit-identical, the sum and the residual add bit-exact,
// the norm within the reference's bound, the quantized codes exact against the kernel's own norm output.
// On a GPU older than sm_100, run<ResidualRmsNormNvfp4> must throw std::invalid_argument instead.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;

namespace {

using fiar_test::Stream;

template <class T>
using GpuWorkspace = fiar_test::GpuWorkspace<fiar::TrtllmPolicy, T>;

// The parameters every call uses (those of the host tests' default case).
constexpr float kScale = 0.75f;      // static FP8 scale, NVFP4 global scale
constexpr float kWeightBias = 0.0f;  // standard RMSNorm

// One collective call every rank makes.
struct Case {
  Pattern pattern = Pattern::AllReduce;
  fiar_test::FusedCall call;
  /// run<> must throw std::invalid_argument whose message contains this (NVFP4 on float, or before sm_100).
  std::string rejected_with;
};

Case make_case(Pattern p, Strategy s, int tokens, fiar::ScaleLayout layout, bool in_place, std::string rejected_with) {
  return {p,
          {.tokens = tokens, .strategy = s, .quant = layout, .in_place = in_place, .weight_bias = kWeightBias},
          std::move(rejected_with)};
}

std::string describe(const Case& c) {
  std::string s = std::string(fiar::to_string(c.pattern)) + ", " + std::string(fiar::to_string(c.call.strategy)) +
                  ", " + std::to_string(c.call.tokens) + " tokens";
  if (c.pattern == Pattern::ResidualRmsNormNvfp4 || c.pattern == Pattern::ResidualRmsNormMxfp8)
    s += c.call.quant.layout == fiar::ScaleLayout::Linear ? ", linear scales" : ", swizzled scales";
  if (c.pattern == Pattern::ResidualRmsNormFp8Group) s += std::string(", ") + fiar::to_string(c.call.quant.group_scale);
  if (c.call.in_place) s += ", in place";
  if (!c.rejected_with.empty()) s += ", must be rejected with '" + c.rejected_with + "'";
  return s;
}

// Calls f(std::integral_constant<Pattern, p>{}).
template <class F>
void with_pattern(Pattern p, F&& f) {
  switch (p) {
    case Pattern::AllReduce: f(std::integral_constant<Pattern, Pattern::AllReduce>{}); return;
    case Pattern::ResidualRmsNorm: f(std::integral_constant<Pattern, Pattern::ResidualRmsNorm>{}); return;
    case Pattern::ResidualRmsNormFp8: f(std::integral_constant<Pattern, Pattern::ResidualRmsNormFp8>{}); return;
    case Pattern::ResidualRmsNormFp8Dynamic:
      f(std::integral_constant<Pattern, Pattern::ResidualRmsNormFp8Dynamic>{});
      return;
    case Pattern::ResidualRmsNormNvfp4: f(std::integral_constant<Pattern, Pattern::ResidualRmsNormNvfp4>{}); return;
    case Pattern::RmsNorm: f(std::integral_constant<Pattern, Pattern::RmsNorm>{}); return;
    case Pattern::ResidualRmsNormPrePost: f(std::integral_constant<Pattern, Pattern::ResidualRmsNormPrePost>{}); return;
    case Pattern::ResidualRmsNormFp8Group:
      f(std::integral_constant<Pattern, Pattern::ResidualRmsNormFp8Group>{});
      return;
    case Pattern::ResidualRmsNormMxfp8: f(std::integral_constant<Pattern, Pattern::ResidualRmsNormMxfp8>{}); return;
    case Pattern::MoeFinalizeAllReduce: f(std::integral_constant<Pattern, Pattern::MoeFinalizeAllReduce>{}); return;
    case Pattern::MoeFinalizeResidualRmsNorm:
      f(std::integral_constant<Pattern, Pattern::MoeFinalizeResidualRmsNorm>{});
      return;
  }
  throw std::logic_error("unknown pattern");
}

// What one rank got: the workspace's arch and each case's result, in order.
template <class T>
struct RankRun {
  int arch = 0;
  std::vector<fiar_test::FusedResult<T>> cases;
};

// Creates one workspace per rank (world ranks on device 0, sized for the largest case) and runs every case on it,
// in order (fiar_test::run_fused: the host test's tensors and arguments, in device memory, on the rank's stream).
template <class T>
std::vector<RankRun<T>> run_cases(int world, int hidden, const std::vector<Case>& cases) {
  int max_tokens = 1;
  std::size_t max_scale_bytes = 1;
  for (const Case& c : cases) {
    max_tokens = std::max(max_tokens, c.call.tokens);
    if (hidden % 16 == 0) {
      max_scale_bytes =
          std::max(max_scale_bytes, fiar::algo::nvfp4_scale_bytes(c.call.tokens, hidden, c.call.quant.layout));
    }
    if (hidden % 32 == 0) {
      max_scale_bytes =
          std::max(max_scale_bytes, fiar::algo::mxfp8_scale_bytes(c.call.tokens, hidden, c.call.quant.layout));
    }
    max_scale_bytes =
        std::max(max_scale_bytes, fiar::algo::fp8_group_scale_bytes(c.call.tokens, hidden,
                                                                    fiar_test::group_size_for<T>(c.call.quant, hidden),
                                                                    c.call.quant.group_scale));
  }
  return fiar_test::on_ranks(fiar_test::ranks_on_gpu(world), [&](int rank, fiar::InProcessBootstrap& boot) {
    Stream stream;
    fiar_test::FusedBuffers<T> b(max_tokens, hidden, max_scale_bytes);
    b.set_constants(hidden, kScale, stream.s);
    GpuWorkspace<T> ws(boot, fiar::discover_topology(boot), fiar_test::one_shot_config(max_tokens, hidden, 10s));
    RankRun<T> mine;
    mine.arch = ws.arch();
    fiar_test::finish_together(boot, [&] {
      for (const Case& c : cases) {
        with_pattern(c.pattern, [&](auto p) {
          mine.cases.push_back(fiar_test::run_fused<decltype(p)::value>(ws, b, stream.s, rank, hidden, c.call));
        });
      }
    });
    return mine;
  });
}

// Runs the cases and checks every one against the reference.
template <class T>
void run_and_check(int world, int hidden, const std::vector<Case>& cases) {
  INFO("world " << world << " on device 0, " << fiar_test::dtype_label<T>() << ", hidden " << hidden);
  const auto results = run_cases<T>(world, hidden, cases);
  const int arch = fiar_test::device_arch(0);
  for (int r = 0; r < world; ++r) CHECK(results[static_cast<std::size_t>(r)].arch == arch);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << i << ": " << describe(c));
    if (!c.rejected_with.empty()) {
      for (int r = 0; r < world; ++r) {
        const std::string& what = results[static_cast<std::size_t>(r)].cases[i].rejection;
        CAPTURE(r, what);
        CHECK(what.find(c.rejected_with) != std::string::npos);
      }
      continue;
    }
    std::vector<fiar_test::Outputs<T>> outs;
    for (int r = 0; r < world; ++r) {
      const fiar_test::FusedResult<T>& got = results[static_cast<std::size_t>(r)].cases[i];
      CAPTURE(r, got.rejection);
      REQUIRE(got.rejection.empty());
      CHECK(got.ran == c.call.strategy);
      outs.push_back(got.outputs);
    }
    with_pattern(c.pattern, [&](auto p) {
      fiar_test::check_pattern<decltype(p)::value, T>(fiar_test::Shape{world, c.call.tokens, hidden}, outs, true,
                                                      c.call.quant, kWeightBias, kScale);
    });
  }
}

// NVFP4: 3 tokens, and 130 (row padding of the swizzled layout past one 128-row tile; linear once) on
// sm_100+ with 16-bit input; a rejection naming sm_100 on older GPUs, one naming 16-bit input for float.
template <class T>
void add_nvfp4_cases(std::vector<Case>& cases, Strategy s, int arch, bool in_place) {
  const Pattern P = Pattern::ResidualRmsNormNvfp4;
  const auto swizzled = fiar::ScaleLayout::Swizzled128x4;
  if (!std::is_same_v<T, float> && arch < 100) {
    cases.push_back(make_case(P, s, 3, swizzled, in_place, "sm_100"));
    cases.push_back(make_case(P, s, 130, swizzled, in_place, "sm_100"));
    return;
  }
  if (std::is_same_v<T, float>) {
    if (s == Strategy::OneShot) cases.push_back(make_case(P, s, 3, swizzled, in_place, "16-bit input"));
    return;
  }
  cases.push_back(make_case(P, s, 3, swizzled, in_place, ""));
  cases.push_back(make_case(P, s, 130, swizzled, in_place, ""));
  if (s == Strategy::OneShot) cases.push_back(make_case(P, s, 130, fiar::ScaleLayout::Linear, in_place, ""));
}

// For one-shot, then two-shot: every pattern but NVFP4 with `tokens` tokens (MXFP8 where `hidden` holds 32-element
// blocks, both layouts), then the NVFP4 cases for T on `arch`.
template <class T>
std::vector<Case> every_pattern(int tokens, bool in_place, int arch, int hidden) {
  std::vector<Case> cases;
  for (const Strategy s : {Strategy::OneShot, Strategy::TwoShot}) {
    for (const Pattern p :
         {Pattern::AllReduce, Pattern::ResidualRmsNorm, Pattern::ResidualRmsNormFp8, Pattern::ResidualRmsNormFp8Dynamic,
          Pattern::RmsNorm, Pattern::ResidualRmsNormPrePost, Pattern::ResidualRmsNormFp8Group}) {
      cases.push_back(make_case(p, s, tokens, fiar::ScaleLayout::Swizzled128x4, in_place, ""));
    }
    if (hidden % 32 == 0) {
      for (const auto layout : {fiar::ScaleLayout::Swizzled128x4, fiar::ScaleLayout::Linear}) {
        cases.push_back(make_case(Pattern::ResidualRmsNormMxfp8, s, tokens, layout, in_place, ""));
      }
    }
    // The MoE finalize: 8 experts and the shared one; 10 experts (two batches of loads), none, a scaling factor.
    for (const Pattern p : {Pattern::MoeFinalizeAllReduce, Pattern::MoeFinalizeResidualRmsNorm}) {
      Case moe = make_case(p, s, tokens, fiar::ScaleLayout::Swizzled128x4, in_place, "");
      moe.call.quant = fiar_test::QuantOptions::moe(p == Pattern::MoeFinalizeAllReduce ? 8 : 10,
                                                    p == Pattern::MoeFinalizeAllReduce, 2.5f);
      cases.push_back(moe);
    }
    // The FP8 groups' fp32 scales too (the packed exponents above).
    Case f32 = make_case(Pattern::ResidualRmsNormFp8Group, s, tokens, fiar::ScaleLayout::Swizzled128x4, in_place, "");
    f32.call.quant.group_scale = fiar::GroupScale::Float32;
    cases.push_back(f32);
    add_nvfp4_cases<T>(cases, s, arch, in_place);
  }
  return cases;
}

}  // namespace

TEMPLATE_TEST_CASE("every pattern x world size x hidden size on ranks sharing one GPU matches the reference",
                   "[gpu][fusion]", float, __half, __nv_bfloat16) {
  const int world = GENERATE(2, 4);
  // 2048, 7168 (more vectors than threads for float), and an odd multiple of the vector width and of 16.
  const int hidden = GENERATE(2048, 7168, 16 * 19);
  run_and_check<TestType>(world, hidden, every_pattern<TestType>(3, false, fiar_test::device_arch(0), hidden));
}

TEST_CASE("in place on the GPU: out == in, norm_out == in, residual_out == residual_in", "[gpu][fusion]") {
  run_and_check<__nv_bfloat16>(4, 2048, every_pattern<__nv_bfloat16>(6, true, fiar_test::device_arch(0), 2048));
  std::vector<Case> cases;
  for (const Strategy s : {Strategy::OneShot, Strategy::TwoShot}) {
    cases.push_back(make_case(Pattern::ResidualRmsNormFp8Dynamic, s, 6, fiar::ScaleLayout::Swizzled128x4, true, ""));
    cases.push_back(make_case(Pattern::AllReduce, s, 6, fiar::ScaleLayout::Swizzled128x4, true, ""));
  }
  run_and_check<float>(2, 16 * 19, cases);
}
