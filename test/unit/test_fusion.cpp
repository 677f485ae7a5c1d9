// SPDX-License-Identifier: Apache-2.0
// Fused epilogues on the host emulator (trtllm): residual add + RMSNorm, static and dynamic FP8, NVFP4 (swizzled
// and linear scales) at model hidden sizes, against the plain C++ reference of test/common/fusion_reference.hpp (fp64
// where the kernel's reduction order is free). test/gpu/test_gpu_fusion.cpp runs the same checks on real GPUs; what
// every backend does with fused calls (aliasing, validation) is tested once for all in test_backends.cpp.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"

using fiar::Pattern;
using fiar::Strategy;
using fiar_test::run_and_check;
using fiar_test::Shape;

TEMPLATE_TEST_CASE("every pattern x world size x hidden size matches the reference", "[fusion]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(from_range(fiar_test::sizes_for({2, 4, 8}, {2, 4})));
  // 2048, 7168, 8192, and an odd multiple of the vector width (and of 16 elements, for NVFP4).
  const int hidden = GENERATE(from_range(fiar_test::sizes_for({2048, 7168, 8192, 16 * 19}, {2048, 16 * 19})));
  const Shape s{world, 3, hidden};
  const Strategy strategy = world == 4 ? Strategy::TwoShot : Strategy::OneShot;
  run_and_check<Pattern::AllReduce, TestType>(s, strategy, false);
  run_and_check<Pattern::ResidualRmsNorm, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8, TestType>(s, strategy, true);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, strategy, true);
  if constexpr (sizeof(TestType) == 2) run_and_check<Pattern::ResidualRmsNormNvfp4, TestType>(s, strategy, true);
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
