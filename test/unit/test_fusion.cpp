// Fused epilogues on the host emulator: residual add + RMSNorm, static and dynamic FP8, NVFP4 (swizzled
// and linear scales), against a plain C++ reference (fp64 where the kernel's reduction order is free).
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::as_float;
using fiar_test::bits;
using fiar_test::from_float;

namespace {

template <class T>
using HostWorkspace = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform>;

std::uint8_t fp8(float x) { return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }
float fp8_value(std::uint8_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3)));
}
std::uint8_t fp4(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xf);
}

// The swizzled 128x4 offset, restated from the layout's definition.
std::size_t swizzled_offset(int m, int k, int cols) {
  const int k_tiles = (cols + 3) / 4;
  return static_cast<std::size_t>(m / 128) * k_tiles * 512 + static_cast<std::size_t>(k / 4) * 512 + (m % 32) * 16 +
         ((m % 128) / 32) * 4 + (k % 4);
}

struct Shape {
  int world, tokens, hidden;
};

// What every rank produced for one call.
template <class T>
struct Outputs {
  std::vector<T> out, residual_out, norm_out;
  std::vector<std::uint8_t> quant, block_scales;
  std::vector<float> scale_out;
};

template <class T>
std::vector<T> residual_of(std::size_t count, int call) {
  return fiar_test::make_input<T>(count, 1000, call, false);
}
template <class T>
std::vector<T> gamma_of(int hidden) {
  std::vector<T> g(static_cast<std::size_t>(hidden));
  for (int i = 0; i < hidden; ++i) g[static_cast<std::size_t>(i)] = from_float<T>(0.5f + 0.25f * static_cast<float>((i * 7) % 9) / 8.0f);
  return g;
}

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

// Checks rank 0's outputs (and that every rank's are identical) against the reference.
template <Pattern P, class T>
void check_pattern(const Shape& s, const std::vector<Outputs<T>>& outs, bool with_norm_out, fiar::ScaleLayout layout,
                   float weight_bias, float scale) {
  const std::size_t count = static_cast<std::size_t>(s.tokens) * s.hidden;
  for (std::size_t r = 1; r < outs.size(); ++r) {
    CHECK(outs[r].residual_out.size() == outs[0].residual_out.size());
    CHECK(std::equal(outs[r].norm_out.begin(), outs[r].norm_out.end(), outs[0].norm_out.begin(),
                     [](T a, T b) { return bits(a) == bits(b); }));
    CHECK(outs[r].quant == outs[0].quant);
    CHECK(outs[r].block_scales == outs[0].block_scales);
    CHECK(outs[r].scale_out == outs[0].scale_out);
  }
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < s.world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, 0, false));
  const std::vector<T> sum = fiar_test::rank_order_sum(inputs, count);
  const Outputs<T>& o = outs[0];
  int mismatches = 0;
  if constexpr (P == Pattern::AllReduce) {
    for (std::size_t i = 0; i < count; ++i) mismatches += bits(o.out[i]) != bits(sum[i]);
    CHECK(mismatches == 0);
    return;
  } else {
    const std::vector<T> residual = residual_of<T>(count, 0);
    const std::vector<T> gamma = gamma_of<T>(s.hidden);
    const double ulp = fiar_test::unit_roundoff<T>() * 2;
    for (int t = 0; t < s.tokens; ++t) {
      // Residual add: bit-exact (one fp32 add, one rounding).
      std::vector<T> y(static_cast<std::size_t>(s.hidden));
      double squares = 0;
      for (int h = 0; h < s.hidden; ++h) {
        const std::size_t i = static_cast<std::size_t>(t) * s.hidden + h;
        y[static_cast<std::size_t>(h)] = from_float<T>(as_float(sum[i]) + as_float(residual[i]));
        mismatches += bits(o.residual_out[i]) != bits(y[static_cast<std::size_t>(h)]);
        squares += static_cast<double>(as_float(y[static_cast<std::size_t>(h)])) * as_float(y[static_cast<std::size_t>(h)]);
      }
      const double inv_rms = 1.0 / std::sqrt(squares / s.hidden + 1e-5);
      // The kernel's norm output (or the reference's, when it wrote none), checked within one ulp of T plus
      // the fp32 error of the mean of squares.
      std::vector<float> n(static_cast<std::size_t>(s.hidden));
      int far = 0;
      for (int h = 0; h < s.hidden; ++h) {
        const std::size_t i = static_cast<std::size_t>(t) * s.hidden + h;
        const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms * (weight_bias + as_float(gamma[static_cast<std::size_t>(h)]));
        if (!o.norm_out.empty()) {
          const double got = as_float(o.norm_out[i]);
          if (std::fabs(got - want) > ulp * std::fabs(want) + 1e-6 * std::fabs(want) + 1e-30) ++far;
          n[static_cast<std::size_t>(h)] = as_float(o.norm_out[i]);
        }
      }
      CHECK(far == 0);
      CHECK(o.norm_out.empty() == !(with_norm_out || P == Pattern::ResidualRmsNorm));
      if (o.norm_out.empty()) {
        // Without norm_out, the FP8 codes are checked against the reference norm: within one e4m3 step
        // (2^-3 relative, 2^-9 absolute near zero) plus one rounding of T.
        if constexpr (P == Pattern::ResidualRmsNormFp8) {
          int off = 0;
          for (int h = 0; h < s.hidden; ++h) {
            const double want = as_float(y[static_cast<std::size_t>(h)]) * inv_rms *
                                (weight_bias + as_float(gamma[static_cast<std::size_t>(h)])) / scale;
            const double got = fp8_value(o.quant[static_cast<std::size_t>(t) * s.hidden + h]);
            const double capped = std::max(-448.0, std::min(448.0, want));
            if (std::fabs(got - capped) > (0.125 + ulp) * std::fabs(capped) + std::ldexp(1.0, -9)) ++off;
          }
          CHECK(off == 0);
        }
        continue;  // the exact checks below use the kernel's own norm values
      }
      if constexpr (P == Pattern::ResidualRmsNormFp8) {
        for (int h = 0; h < s.hidden; ++h) {
          mismatches += o.quant[static_cast<std::size_t>(t) * s.hidden + h] != fp8(n[static_cast<std::size_t>(h)] * (1.0f / scale));
        }
      } else if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) {
        float amax = 0;
        for (float x : n) amax = std::max(amax, std::fabs(x));
        const float token_scale = std::max(amax / 448.0f, 1.0f / (512.0f * 448.0f));
        CHECK(o.scale_out[static_cast<std::size_t>(t)] == token_scale);
        for (int h = 0; h < s.hidden; ++h) {
          mismatches += o.quant[static_cast<std::size_t>(t) * s.hidden + h] != fp8(n[static_cast<std::size_t>(h)] / token_scale);
        }
      } else if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
        const int cols = s.hidden / 16;
        for (int k = 0; k < cols; ++k) {
          float amax = 0;
          for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(n[static_cast<std::size_t>(k * 16 + j)]));
          const std::uint8_t sf = fp8(scale * amax / 6.0f);
          const std::size_t at = layout == fiar::ScaleLayout::Linear ? static_cast<std::size_t>(t) * cols + k
                                                                     : swizzled_offset(t, k, cols);
          mismatches += o.block_scales[at] != sf;
          const float factor = fp8_value(sf) == 0.0f ? 0.0f : scale / fp8_value(sf);
          for (int j = 0; j < 16; ++j) {
            const std::uint8_t byte = o.quant[static_cast<std::size_t>(t) * (s.hidden / 2) + (k * 16 + j) / 2];
            const std::uint8_t nibble = j % 2 == 0 ? (byte & 0xf) : (byte >> 4);
            mismatches += nibble != fp4(n[static_cast<std::size_t>(k * 16 + j)] * factor);
          }
        }
      }
    }
    CHECK(mismatches == 0);
    if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
      if (layout == fiar::ScaleLayout::Swizzled128x4) {  // padding rows and columns are zero
        const int cols = s.hidden / 16, padded_cols = (cols + 3) / 4 * 4, padded_rows = (s.tokens + 127) / 128 * 128;
        int nonzero = 0;
        for (int m = 0; m < padded_rows; ++m) {
          for (int k = 0; k < padded_cols; ++k) {
            if ((m >= s.tokens || k >= cols) && o.block_scales[swizzled_offset(m, k, cols)] != 0) ++nonzero;
          }
        }
        CHECK(nonzero == 0);
      }
    }
  }
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
