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

namespace {

template <class T>
using HostWorkspace = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform>;

// Runs pattern P once on every rank (host emulator) and returns each rank's outputs.
template <Pattern P, class T>
std::vector<Outputs<T>> run_pattern(const Shape& s, Strategy strategy, bool with_norm_out, fiar::ScaleLayout layout,
                                    float weight_bias, float scale, bool in_place, int arch = 100) {
  const std::size_t count = static_cast<std::size_t>(s.tokens) * s.hidden;
  std::vector<Outputs<T>> result(static_cast<std::size_t>(s.world));
  std::vector<std::string> errors(static_cast<std::size_t>(s.world));
  fiar::InProcessGroup group(s.world, 60s);
  std::vector<std::thread> threads;
  for (int r = 0; r < s.world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto boot = group.bootstrap(r);
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = s.tokens;
        cfg.hidden_dim = s.hidden;
        cfg.oneshot_at_max_tokens = true;
        HostWorkspace<T> ws(boot, fiar::Topology{.world_size = s.world, .rank = r, .arch = arch}, cfg,
                            fiar::HostPlatformOptions{.blocks = 2, .lanes = 8});
        Outputs<T>& o = result[static_cast<std::size_t>(r)];
        std::vector<T> in = fiar_test::make_input<T>(count, r, 0, false);
        std::vector<T> residual = residual_of<T>(count, 0);
        const std::vector<T> gamma = gamma_of<T>(s.hidden);
        const float scale_value = scale;
        fiar::FusedArgs<T> a;
        a.in = in.data();
        a.num_tokens = s.tokens;
        if constexpr (P == Pattern::AllReduce) {
          o.out.resize(count);
          a.out = in_place ? in.data() : o.out.data();
        } else {
          o.residual_out.resize(count);
          a.residual_in = residual.data();
          a.residual_out = in_place ? residual.data() : o.residual_out.data();
          a.gamma = gamma.data();
          a.eps = 1e-5f;
          a.weight_bias = weight_bias;
          if (with_norm_out || P == Pattern::ResidualRmsNorm) {
            o.norm_out.resize(count);
            a.norm_out = in_place ? in.data() : o.norm_out.data();
          }
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
        if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
          o.quant.assign(count / 2, 0xAA);
          a.quant_out = o.quant.data();
          o.block_scales.assign(fiar::algo::nvfp4_scale_bytes(s.tokens, s.hidden, layout), 0xAA);
          a.block_scale_out = o.block_scales.data();
          a.layout = layout;
        }
        ws.template run<P>(a, nullptr, strategy);
        if (in_place) {
          if constexpr (P == Pattern::AllReduce) {
            o.out = in;
          } else {
            o.residual_out = residual;
            if (!o.norm_out.empty()) o.norm_out = in;
          }
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE(e == "");
  return result;
}

template <Pattern P, class T>
void run_and_check(const Shape& s, Strategy strategy, bool with_norm_out, fiar::ScaleLayout layout = fiar::ScaleLayout::Swizzled128x4,
                   float weight_bias = 0.0f, float scale = 0.75f, bool in_place = false) {
  CAPTURE(fiar::to_string(P), fiar_test::dtype_label<T>(), s.world, s.tokens, s.hidden, fiar::to_string(strategy),
          with_norm_out, weight_bias, in_place);
  const auto outs = run_pattern<P, T>(s, strategy, with_norm_out, layout, weight_bias, scale, in_place);
  check_pattern<P, T>(s, outs, with_norm_out, layout, weight_bias, scale);
}

}  // namespace

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
      std::vector<__nv_bfloat16> in(256), res(256), res_out(256), norm(256), gamma(64);
      std::vector<float> fin(256), fres(256), fres_out(256), fgamma(64);
      std::vector<std::uint8_t> q(256), sf(512);
      float scale = 1.0f;
      auto& m = messages[static_cast<std::size_t>(r)];
      auto reject = [&](auto&& f) {
        try {
          f();
          m.push_back("(accepted)");
        } catch (const std::invalid_argument& e) {
          m.push_back(e.what());
        }
      };
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
      reject([&] { auto b = a; b.eps = -1.0f; ws.run<Pattern::ResidualRmsNorm>(b); });
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
    REQUIRE(m.size() == 9);
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
    CHECK(m[7].find("eps = -1.0") != std::string::npos);
    CHECK(m[8].find("the input is float; NVFP4 takes 16-bit input") != std::string::npos);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
}
