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
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;

namespace {

using fiar_test::DeviceBuffer;
using fiar_test::Stream;

template <class T>
using GpuWorkspace = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::CudaPlatform>;


// The parameters every call uses (those of the host tests' default case).
constexpr float kScale = 0.75f;       // static FP8 scale, NVFP4 global scale
constexpr float kWeightBias = 0.0f;   // standard RMSNorm
constexpr float kEps = 1e-5f;         // what check_pattern assumes

// sm_XY of device 0, as the CUDA runtime reports it.
int device0_arch() {
  int major = 0, minor = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  return major * 10 + minor;
}


// One collective call every rank makes.
struct Case {
  Pattern pattern = Pattern::AllReduce;
  Strategy strategy = Strategy::OneShot;
  int tokens = 3;
  fiar::ScaleLayout layout = fiar::ScaleLayout::Swizzled128x4;
  bool in_place = false;  ///< out == in; norm_out == in, residual_out == residual_in
  /// run<> must throw std::invalid_argument whose message contains this (NVFP4 on float, or before sm_100).
  std::string rejected_with;
};

std::string describe(const Case& c) {
  std::string s = std::string(fiar::to_string(c.pattern)) + ", " + std::string(fiar::to_string(c.strategy)) + ", " +
                  std::to_string(c.tokens) + " tokens";
  if (c.pattern == Pattern::ResidualRmsNormNvfp4)
    s += c.layout == fiar::ScaleLayout::Linear ? ", linear scales" : ", swizzled scales";
  if (c.in_place) s += ", in place";
  if (!c.rejected_with.empty()) s += ", must be rejected with '" + c.rejected_with + "'";
  return s;
}

// What one rank got from one case.
template <class T>
struct RankResult {
  fiar_test::Outputs<T> outputs;
  std::string rejection;  ///< what run<> threw (std::invalid_argument), "" when it ran
  Strategy ran = Strategy::Auto;
};

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
  }
  throw std::logic_error("unknown pattern");
}

// One rank's device tensors, sized for the largest case and allocated before the workspace (its creation
// ends with a barrier, so no rank is inside cudaMalloc / cudaFree, which may wait for the whole device,
// while a peer's kernel waits for it).
template <class T>
struct RankBuffers {
  DeviceBuffer<T> in, residual, out, residual_out, norm_out, gamma;
  DeviceBuffer<std::uint8_t> quant, block_scales;
  DeviceBuffer<float> scale, scale_out;
  RankBuffers(std::size_t count, int tokens, int hidden, std::size_t scale_bytes)
      : in(count), residual(count), out(count), residual_out(count), norm_out(count),
        gamma(static_cast<std::size_t>(hidden)), quant(count), block_scales(scale_bytes), scale(1),
        scale_out(static_cast<std::size_t>(tokens)) {}
};

template <class T>
void upload(T* to, const std::vector<T>& from, cudaStream_t s) {
  GPU_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}
template <class T>
void download(std::vector<T>& to, const T* from, std::size_t count, cudaStream_t s) {
  to.resize(count);
  GPU_CHECK(cudaMemcpyAsync(to.data(), from, count * sizeof(T), cudaMemcpyDeviceToHost, s));
}

// Runs one case on this rank: the same tensors and arguments as the host test's run_pattern, in device
// memory (the scale too), with every output first filled with a pattern the kernel must overwrite.
template <Pattern P, class T>
void run_case(GpuWorkspace<T>& ws, RankBuffers<T>& b, cudaStream_t stream, const Case& c, int rank, int hidden,
              RankResult<T>& result) {
  const std::size_t count = static_cast<std::size_t>(c.tokens) * static_cast<std::size_t>(hidden);
  constexpr bool fp8 = P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic;
  constexpr bool nvfp4 = P == Pattern::ResidualRmsNormNvfp4;
  const std::size_t quant_bytes = nvfp4 ? count / 2 : count;
  const std::size_t scale_bytes = nvfp4 ? fiar::algo::nvfp4_scale_bytes(c.tokens, hidden, c.layout) : 0;
  // Host sources stay alive until the stream is synchronized below.
  const std::vector<T> in = fiar_test::make_input<T>(count, rank, 0, false);
  const std::vector<T> residual = fiar_test::residual_of<T>(count, 0);
  const std::vector<float> unset_scales(static_cast<std::size_t>(c.tokens), -1.0f);
  upload(b.in.p, in, stream);
  upload(b.residual.p, residual, stream);
  GPU_CHECK(cudaMemsetAsync(b.out.p, 0xff, count * sizeof(T), stream));  // NaN in every type
  GPU_CHECK(cudaMemsetAsync(b.residual_out.p, 0xff, count * sizeof(T), stream));
  GPU_CHECK(cudaMemsetAsync(b.norm_out.p, 0xff, count * sizeof(T), stream));
  GPU_CHECK(cudaMemsetAsync(b.quant.p, 0xAA, quant_bytes, stream));
  if (scale_bytes != 0) GPU_CHECK(cudaMemsetAsync(b.block_scales.p, 0xAA, scale_bytes, stream));
  upload(b.scale_out.p, unset_scales, stream);

  fiar::FusedArgs<T> a;
  a.in = b.in.p;
  a.num_tokens = c.tokens;
  if constexpr (P == Pattern::AllReduce) {
    a.out = c.in_place ? b.in.p : b.out.p;
  } else {
    a.residual_in = b.residual.p;
    a.residual_out = c.in_place ? b.residual.p : b.residual_out.p;
    a.gamma = b.gamma.p;
    a.eps = kEps;
    a.weight_bias = kWeightBias;
    a.norm_out = c.in_place ? b.in.p : b.norm_out.p;
  }
  if constexpr (fp8 || nvfp4) a.quant_out = b.quant.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8 || nvfp4) a.scale = b.scale.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) a.scale_out = b.scale_out.p;
  if constexpr (nvfp4) {
    a.block_scale_out = b.block_scales.p;
    a.layout = c.layout;
  }

  if (!c.rejected_with.empty()) {
    try {
      ws.template run<P>(a, stream, c.strategy);
    } catch (const std::invalid_argument& e) {
      result.rejection = e.what();
      GPU_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    // Accepted (every rank alike): it launched, so finish the call to keep the ranks in step; the
    // caller reports the missing rejection.
  } else {
    ws.template run<P>(a, stream, c.strategy);
  }
  result.ran = ws.last_strategy();
  // Wait for the kernel before copying back: a device-to-host copy into pageable memory blocks this thread
  // inside the runtime while its kernel waits for peers that share the GPU, and those peers' threads may
  // need the runtime to launch (docs/troubleshooting.md, "ranks sharing one GPU").
  GPU_CHECK(cudaStreamSynchronize(stream));

  fiar_test::Outputs<T>& o = result.outputs;
  if constexpr (P == Pattern::AllReduce) {
    download(o.out, c.in_place ? b.in.p : b.out.p, count, stream);
  } else {
    download(o.residual_out, c.in_place ? b.residual.p : b.residual_out.p, count, stream);
    download(o.norm_out, c.in_place ? b.in.p : b.norm_out.p, count, stream);
  }
  if constexpr (fp8 || nvfp4) download(o.quant, b.quant.p, quant_bytes, stream);
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic)
    download(o.scale_out, b.scale_out.p, static_cast<std::size_t>(c.tokens), stream);
  if constexpr (nvfp4) download(o.block_scales, b.block_scales.p, scale_bytes, stream);
  GPU_CHECK(cudaStreamSynchronize(stream));
  ws.check();
}

// Creates one workspace per rank (world ranks on device 0, sized for the largest case) and runs every case
// on it, in order. Returns [case][rank]; throws what a rank threw (Catch2 is not thread-safe: the rank
// threads only record).
template <class T>
std::vector<std::vector<RankResult<T>>> run_cases(int world, int hidden, const std::vector<Case>& cases,
                                                  std::vector<int>& archs) {
  int max_tokens = 1;
  std::size_t max_scale_bytes = 1;
  for (const Case& c : cases) {
    max_tokens = std::max(max_tokens, c.tokens);
    if (hidden % 16 == 0) {
      max_scale_bytes = std::max(max_scale_bytes, fiar::algo::nvfp4_scale_bytes(c.tokens, hidden, c.layout));
    }
  }
  const std::size_t max_count = static_cast<std::size_t>(max_tokens) * static_cast<std::size_t>(hidden);
  std::vector<std::vector<RankResult<T>>> results(cases.size(), std::vector<RankResult<T>>(static_cast<std::size_t>(world)));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  archs.assign(static_cast<std::size_t>(world), 0);
  fiar::InProcessGroup group(world, 60s);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      try {
        GPU_CHECK(cudaSetDevice(0));
        Stream stream;
        RankBuffers<T> b(max_count, max_tokens, hidden, max_scale_bytes);
        const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
        const float scale = kScale;
        GPU_CHECK(cudaMemcpyAsync(b.gamma.p, gamma.data(), gamma.size() * sizeof(T), cudaMemcpyHostToDevice, stream.s));
        GPU_CHECK(cudaMemcpyAsync(b.scale.p, &scale, sizeof(float), cudaMemcpyHostToDevice, stream.s));
        GPU_CHECK(cudaStreamSynchronize(stream.s));
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = max_tokens;
        cfg.hidden_dim = hidden;
        cfg.oneshot_at_max_tokens = true;
        cfg.timeout = 10s;
        GpuWorkspace<T> ws(boot, fiar::discover_topology(boot), cfg);
        archs[static_cast<std::size_t>(r)] = ws.arch();
        std::string failure;
        try {
          for (std::size_t i = 0; i < cases.size(); ++i) {
            with_pattern(cases[i].pattern, [&](auto p) {
              run_case<decltype(p)::value, T>(ws, b, stream.s, cases[i], r, hidden,
                                              results[i][static_cast<std::size_t>(r)]);
            });
          }
        } catch (const std::exception& e) {
          failure = e.what();  // peers waiting for this rank time out; all meet at the barrier below
        }
        boot.barrier();  // no rank frees its buffers while a peer's kernel may still write into them
        if (!failure.empty()) throw std::runtime_error(failure);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    CAPTURE(world, r);
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
  }
  return results;
}

// Runs the cases and checks every one against the reference.
template <class T>
void run_and_check(int world, int hidden, const std::vector<Case>& cases) {
  INFO("world " << world << " on device 0, " << fiar_test::dtype_label<T>() << ", hidden " << hidden);
  std::vector<int> archs;
  const auto results = run_cases<T>(world, hidden, cases, archs);
  const int arch = device0_arch();
  for (int r = 0; r < world; ++r) CHECK(archs[static_cast<std::size_t>(r)] == arch);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const auto& per_rank = results[i];
    INFO("case " << i << ": " << describe(c));
    if (!c.rejected_with.empty()) {
      for (int r = 0; r < world; ++r) {
        const std::string& what = per_rank[static_cast<std::size_t>(r)].rejection;
        CAPTURE(r, what);
        CHECK(what.find(c.rejected_with) != std::string::npos);
      }
      continue;
    }
    std::vector<fiar_test::Outputs<T>> outs;
    for (int r = 0; r < world; ++r) {
      const RankResult<T>& got = per_rank[static_cast<std::size_t>(r)];
      CAPTURE(r, got.rejection);
      REQUIRE(got.rejection.empty());
      CHECK(got.ran == c.strategy);
      outs.push_back(got.outputs);
    }
    with_pattern(c.pattern, [&](auto p) {
      fiar_test::check_pattern<decltype(p)::value, T>(fiar_test::Shape{world, c.tokens, hidden}, outs, true, c.layout,
                                                      kWeightBias, kScale);
    });
  }
}

// NVFP4: 3 tokens, and 130 (row padding of the swizzled layout past one 128-row tile; linear once) on
// sm_100+ with 16-bit input; a rejection naming sm_100 on older GPUs, one naming 16-bit input for float.
template <class T>
void add_nvfp4_cases(std::vector<Case>& cases, Strategy s, int arch, bool in_place) {
  const Pattern P = Pattern::ResidualRmsNormNvfp4;
  if (!std::is_same_v<T, float> && arch < 100) {
    cases.push_back({P, s, 3, fiar::ScaleLayout::Swizzled128x4, in_place, "sm_100"});
    cases.push_back({P, s, 130, fiar::ScaleLayout::Swizzled128x4, in_place, "sm_100"});
    return;
  }
  if (std::is_same_v<T, float>) {
    if (s == Strategy::OneShot) cases.push_back({P, s, 3, fiar::ScaleLayout::Swizzled128x4, in_place, "16-bit input"});
    return;
  }
  cases.push_back({P, s, 3, fiar::ScaleLayout::Swizzled128x4, in_place, ""});
  cases.push_back({P, s, 130, fiar::ScaleLayout::Swizzled128x4, in_place, ""});
  if (s == Strategy::OneShot) cases.push_back({P, s, 130, fiar::ScaleLayout::Linear, in_place, ""});
}

}  // namespace

TEMPLATE_TEST_CASE("every pattern x world size x hidden size on ranks sharing one GPU matches the reference",
                   "[gpu][fusion]", float, __half, __nv_bfloat16) {
  const int world = GENERATE(2, 4);
  // 2048, 7168 (more vectors than threads for float), and an odd multiple of the vector width and of 16.
  const int hidden = GENERATE(2048, 7168, 16 * 19);
  const int arch = device0_arch();
  std::vector<Case> cases;
  for (const Strategy s : {Strategy::OneShot, Strategy::TwoShot}) {
    for (const Pattern p : {Pattern::AllReduce, Pattern::ResidualRmsNorm, Pattern::ResidualRmsNormFp8,
                            Pattern::ResidualRmsNormFp8Dynamic}) {
      cases.push_back({p, s, 3, fiar::ScaleLayout::Swizzled128x4, false, ""});
    }
    add_nvfp4_cases<TestType>(cases, s, arch, false);
  }
  run_and_check<TestType>(world, hidden, cases);
}

TEST_CASE("in place on the GPU: out == in, norm_out == in, residual_out == residual_in", "[gpu][fusion]") {
  const int arch = device0_arch();
  std::vector<Case> cases;
  for (const Strategy s : {Strategy::OneShot, Strategy::TwoShot}) {
    for (const Pattern p : {Pattern::AllReduce, Pattern::ResidualRmsNorm, Pattern::ResidualRmsNormFp8,
                            Pattern::ResidualRmsNormFp8Dynamic}) {
      cases.push_back({p, s, 6, fiar::ScaleLayout::Swizzled128x4, true, ""});
    }
    add_nvfp4_cases<__nv_bfloat16>(cases, s, arch, true);
  }
  run_and_check<__nv_bfloat16>(4, 2048, cases);
  cases.clear();
  for (const Strategy s : {Strategy::OneShot, Strategy::TwoShot}) {
    cases.push_back({Pattern::ResidualRmsNormFp8Dynamic, s, 6, fiar::ScaleLayout::Swizzled128x4, true, ""});
    cases.push_back({Pattern::AllReduce, s, 6, fiar::ScaleLayout::Swizzled128x4, true, ""});
  }
  run_and_check<float>(2, 16 * 19, cases);
}
