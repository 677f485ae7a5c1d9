// Fused epilogues on the host emulator: residual add + RMSNorm, static and dynamic FP8, NVFP4 (swizzled
// and linear scales), against the plain C++ reference of test/common/fusion_reference.hpp (fp64 where the
// kernel's reduction order is free). test/gpu/test_gpu_fusion.cu runs the same checks on real GPUs.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::as_float;
using fiar_test::bits;
using fiar_test::from_float;
using fiar_test::check_pattern;
using fiar_test::gamma_of;
using fiar_test::Outputs;
using fiar_test::residual_of;
using fiar_test::Shape;

using fiar_test::run_and_check;
using fiar_test::run_pattern;

template <class T>
using HostWorkspace = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform>;

TEMPLATE_TEST_CASE("every pattern x world size x hidden size matches the reference", "[fusion]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(2, 4, 8);
  // 2048, 7168, 8192, and an odd multiple of the vector width (and of 16 elements, for NVFP4).
  const int hidden = GENERATE(2048, 7168, 8192, 16 * 19);
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
  run_and_check<Pattern::ResidualRmsNormNvfp4, __nv_bfloat16>({4, 5, 512}, strategy, with_norm, {}, 1.0f, 448.0f * 6.0f / 8.0f);
}

TEST_CASE("NVFP4: token counts around 128 (row padding) and both scale layouts", "[fusion]") {
  const int tokens = GENERATE(1, 127, 128, 130);
  const auto layout = GENERATE(fiar::ScaleLayout::Swizzled128x4, fiar::ScaleLayout::Linear);
  run_and_check<Pattern::ResidualRmsNormNvfp4, __half>({2, tokens, 80}, Strategy::Auto, true, layout, 0.0f, 336.0f);
}

TEST_CASE("in place: norm_out aliases in, residual_out aliases residual_in", "[fusion]") {
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  run_and_check<Pattern::ResidualRmsNorm, __nv_bfloat16>({4, 6, 256}, strategy, true, {}, 0.0f, 1.0f, true);
  run_and_check<Pattern::ResidualRmsNormFp8Dynamic, float>({4, 6, 256}, strategy, true, {}, 0.0f, 1.0f, true);
  run_and_check<Pattern::ResidualRmsNormNvfp4, __half>({4, 6, 256}, strategy, true, {}, 0.0f, 100.0f, true);
  run_and_check<Pattern::AllReduce, __half>({4, 6, 256}, strategy, false, {}, 0.0f, 1.0f, true);
}

TEST_CASE("fused calls are checked against the pattern before anything runs", "[fusion]") {
  const int world = 2;
  std::vector<std::vector<std::string>> messages(world);
  std::vector<int> wrong(world);
  fiar::InProcessGroup group(world, 30s);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      fiar::WorkspaceConfig cfg;
      cfg.max_token_num = 4;
      cfg.hidden_dim = 64;
      HostWorkspace<__nv_bfloat16> ws(boot, fiar::Topology{.world_size = world, .rank = r, .arch = 90}, cfg);
      HostWorkspace<float> wf(boot, fiar::Topology{.world_size = world, .rank = r, .arch = 100}, cfg);
      HostWorkspace<__nv_bfloat16> w100(boot, fiar::Topology{.world_size = world, .rank = r, .arch = 100}, cfg);
      std::vector<__nv_bfloat16> in(256), res(256), res_out(256), norm(256), gamma(64);
      std::vector<float> fin(256), fres(256), fres_out(256), fgamma(64);
      std::vector<std::uint8_t> q(256), sf(512);
      float scale = 1.0f;
      auto& m = messages[static_cast<std::size_t>(r)];
      auto reject = [&](auto&& f) { m.push_back(fiar_test::thrown<std::invalid_argument>(f, "(accepted)")); };
      fiar::FusedArgs<__nv_bfloat16> a;
      a.in = in.data();
      a.num_tokens = 4;
      a.residual_in = res.data();
      a.residual_out = res_out.data();
      a.gamma = gamma.data();
      a.norm_out = norm.data();
      reject([&] { auto b = a; b.gamma = nullptr; ws.run<Pattern::ResidualRmsNorm>(b); });
      reject([&] { auto b = a; b.norm_out = nullptr; ws.run<Pattern::ResidualRmsNorm>(b); });
      reject([&] { auto b = a; b.out = norm.data(); ws.run<Pattern::ResidualRmsNorm>(b); });
      reject([&] { auto b = a; b.norm_out = res_out.data(); ws.run<Pattern::ResidualRmsNorm>(b); });
      reject([&] { auto b = a; b.residual_out = res.data() + 8; ws.run<Pattern::ResidualRmsNorm>(b); });
      reject([&] { auto b = a; b.quant_out = q.data(); ws.run<Pattern::ResidualRmsNormFp8>(b); });  // no scale
      reject([&] { auto b = a; b.quant_out = q.data(); b.scale = &scale; b.block_scale_out = sf.data(); ws.run<Pattern::ResidualRmsNormNvfp4>(b); });  // sm_90
      reject([&] { auto b = a; b.eps = -1e-7f; ws.run<Pattern::ResidualRmsNorm>(b); });
      fiar::FusedArgs<float> fa;
      fa.in = fin.data();
      fa.num_tokens = 4;
      fa.residual_in = fres.data();
      fa.residual_out = fres_out.data();
      fa.gamma = fgamma.data();
      fa.quant_out = q.data();
      fa.scale = &scale;
      fa.block_scale_out = sf.data();
      reject([&] { wf.run<Pattern::ResidualRmsNormNvfp4>(fa); });
      // Values cast from integers outside their enumerations are rejected, not run as some default.
      reject([&] { ws.run<Pattern::ResidualRmsNorm>(a, nullptr, static_cast<fiar::Strategy>(7)); });
      reject([&] {
        auto b = a;
        b.quant_out = q.data();
        b.scale = &scale;
        b.block_scale_out = sf.data();
        b.layout = static_cast<fiar::ScaleLayout>(5);
        w100.run<Pattern::ResidualRmsNormNvfp4>(b);
      });
      // Nothing was launched: a valid fused call still works on both workspaces.
      std::fill(in.begin(), in.end(), from_float<__nv_bfloat16>(1.0f));
      std::fill(res.begin(), res.end(), from_float<__nv_bfloat16>(2.0f));
      std::fill(gamma.begin(), gamma.end(), from_float<__nv_bfloat16>(1.0f));
      ws.run<Pattern::ResidualRmsNorm>(a);
      for (std::size_t i = 0; i < 256; ++i) {
        wrong[static_cast<std::size_t>(r)] += as_float(res_out[i]) != 4.0f || as_float(norm[i]) != 1.0f;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    const auto& m = messages[static_cast<std::size_t>(r)];
    REQUIRE(m.size() == 11);
    CHECK(m[0].find("residual_rmsnorm on rank") != std::string::npos);
    CHECK(m[0].find("gamma is a null pointer; residual_rmsnorm needs it") != std::string::npos);
    CHECK(m[1].find("norm_out is a null pointer") != std::string::npos);
    CHECK(m[2].find("out = 0x") != std::string::npos);
    CHECK(m[2].find("does not write it") != std::string::npos);
    CHECK(m[3].find("norm_out") != std::string::npos);
    CHECK(m[3].find("residual_out") != std::string::npos);
    CHECK(m[3].find("overlaps norm_out") != std::string::npos);
    CHECK(m[4].find("overlaps residual_in") != std::string::npos);
    CHECK(m[5].find("scale is a null pointer; residual_rmsnorm_fp8 needs it") != std::string::npos);
    CHECK(m[6].find("NVFP4 needs sm_100 or newer, and this workspace runs on sm_90") != std::string::npos);
    CHECK(m[7].find("eps = -1e-07, weight_bias = 0;") != std::string::npos);  // the value as given, not -0.000000
    CHECK(m[8].find("the input is float; NVFP4 takes 16-bit input") != std::string::npos);
    CHECK(m[9].find("Strategy value 7 is not a strategy; allowed: auto, oneshot, twoshot") != std::string::npos);
    CHECK(m[10].find("ScaleLayout value 5 is not a layout; allowed: swizzled128x4, linear") != std::string::npos);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
}
