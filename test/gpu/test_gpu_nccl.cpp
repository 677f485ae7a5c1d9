// The nccl backend on real GPUs: one rank per visible GPU (threads of this process; NCCL cannot put two ranks
// of one communicator on one GPU, so a single-GPU machine runs world size 1). Checked against the references
// of the host tests: bit for bit where NCCL's summation order cannot matter (one rank), within the documented
// bound of the exact sum otherwise, with the epilogue checked bit for bit against the sum NCCL produced. Also:
// an adopted communicator with NcclBootstrap as the bootstrap, and calls captured into a CUDA graph.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
using fiar_test::as_float;
using fiar_test::bits;
using fiar_test::DeviceBuffer;
using fiar_test::from_float;
using fiar_test::Stream;

namespace {

template <class T>
using NcclWorkspace = fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>;

constexpr float kScale = 0.75f;
constexpr float kEps = 1e-5f;  // what check_pattern assumes

// One rank per visible GPU, at most 8.
int gpu_world() {
  int n = 0;
  GPU_CHECK(cudaGetDeviceCount(&n));
  return std::clamp(n, 1, 8);
}

int device_arch(int device) {
  int major = 0, minor = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// One rank's device tensors for `tokens` x `hidden`.
template <class T>
struct RankBuffers {
  DeviceBuffer<T> in, residual, out, residual_out, norm_out, gamma;
  DeviceBuffer<std::uint8_t> quant, block_scales;
  DeviceBuffer<float> scale, scale_out;
  RankBuffers(std::size_t count, int tokens, int hidden)
      : in(count), residual(count), out(count), residual_out(count), norm_out(count),
        gamma(static_cast<std::size_t>(hidden)), quant(count),
        block_scales(fiar::algo::nvfp4_scale_bytes(tokens, hidden, fiar::ScaleLayout::Swizzled128x4)), scale(1),
        scale_out(static_cast<std::size_t>(tokens)) {}
};

template <class T>
void download(std::vector<T>& to, const T* from, std::size_t count) {
  to.resize(count);
  GPU_CHECK(cudaMemcpy(to.data(), from, count * sizeof(T), cudaMemcpyDeviceToHost));
}

// Runs pattern P once on this rank with the host tests' tensors (make_input, residual_of, gamma_of), every
// output first filled with a pattern the kernel must overwrite; returns the outputs, or the rejection text.
template <Pattern P, class T>
std::string run_pattern(NcclWorkspace<T>& ws, RankBuffers<T>& b, cudaStream_t stream, int rank, int tokens,
                        int hidden, fiar_test::Outputs<T>& o) {
  const std::size_t count = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden);
  constexpr bool nvfp4 = P == Pattern::ResidualRmsNormNvfp4;
  constexpr bool fp8 = P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic;
  const std::size_t quant_bytes = nvfp4 ? count / 2 : count;
  const std::size_t scale_bytes = fiar::algo::nvfp4_scale_bytes(tokens, hidden, fiar::ScaleLayout::Swizzled128x4);
  const std::vector<T> in = fiar_test::make_input<T>(count, rank, 0, false);
  const std::vector<T> residual = fiar_test::residual_of<T>(count, 0);
  const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
  const std::vector<float> unset(static_cast<std::size_t>(tokens), -1.0f);
  const float scale = kScale;
  GPU_CHECK(cudaMemcpy(b.in.p, in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b.residual.p, residual.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b.gamma.p, gamma.data(), gamma.size() * sizeof(T), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b.scale.p, &scale, sizeof(float), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b.scale_out.p, unset.data(), unset.size() * sizeof(float), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemset(b.out.p, 0xff, count * sizeof(T)));
  GPU_CHECK(cudaMemset(b.residual_out.p, 0xff, count * sizeof(T)));
  GPU_CHECK(cudaMemset(b.norm_out.p, 0xff, count * sizeof(T)));
  GPU_CHECK(cudaMemset(b.quant.p, 0xAA, quant_bytes));
  GPU_CHECK(cudaMemset(b.block_scales.p, 0xAA, scale_bytes));
  // The copies and fills ran on the legacy stream, which a non-blocking stream does not wait for.
  GPU_CHECK(cudaDeviceSynchronize());

  fiar::FusedArgs<T> a;
  a.in = b.in.p;
  a.num_tokens = tokens;
  if constexpr (P == Pattern::AllReduce) {
    a.out = b.out.p;
  } else {
    a.residual_in = b.residual.p;
    a.residual_out = b.residual_out.p;
    a.gamma = b.gamma.p;
    a.eps = kEps;
    a.norm_out = b.norm_out.p;
  }
  if constexpr (fp8 || nvfp4) a.quant_out = b.quant.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8 || nvfp4) a.scale = b.scale.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) a.scale_out = b.scale_out.p;
  if constexpr (nvfp4) a.block_scale_out = b.block_scales.p;
  try {
    ws.template run<P>(a, stream);
  } catch (const std::invalid_argument& e) {
    return e.what();  // every rank rejects alike (arch, dtype): nothing was enqueued anywhere
  }
  GPU_CHECK(cudaStreamSynchronize(stream));
  ws.check();
  if constexpr (P == Pattern::AllReduce) {
    download(o.out, b.out.p, count);
  } else {
    download(o.residual_out, b.residual_out.p, count);
    download(o.norm_out, b.norm_out.p, count);
  }
  if constexpr (fp8 || nvfp4) download(o.quant, b.quant.p, quant_bytes);
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) download(o.scale_out, b.scale_out.p, static_cast<std::size_t>(tokens));
  if constexpr (nvfp4) download(o.block_scales, b.block_scales.p, scale_bytes);
  return "";
}

// Everything one rank produced: each pattern's outputs (or its rejection).
template <class T>
struct RankResults {
  fiar_test::Outputs<T> all_reduce, norm, fp8, fp8_dynamic, nvfp4;
  std::string nvfp4_rejection;
};

// Every pattern on every rank (one per GPU), with communicators the workspaces create.
template <class T>
std::vector<RankResults<T>> run_all_patterns(int world, int tokens, int hidden) {
  std::vector<RankResults<T>> results(static_cast<std::size_t>(world));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  fiar::InProcessGroup group(world, 120s);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      try {
        GPU_CHECK(cudaSetDevice(r));
        Stream stream;
        RankBuffers<T> b(static_cast<std::size_t>(tokens) * hidden, tokens, hidden);
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = tokens;
        cfg.hidden_dim = hidden;
        cfg.timeout = 60s;
        std::string failure;
        {
          NcclWorkspace<T> ws(boot, fiar::discover_topology(boot), cfg);
          try {
            RankResults<T>& o = results[static_cast<std::size_t>(r)];
            std::string rejected;  // none of these may be rejected
            rejected += run_pattern<Pattern::AllReduce, T>(ws, b, stream.s, r, tokens, hidden, o.all_reduce);
            rejected += run_pattern<Pattern::ResidualRmsNorm, T>(ws, b, stream.s, r, tokens, hidden, o.norm);
            rejected += run_pattern<Pattern::ResidualRmsNormFp8, T>(ws, b, stream.s, r, tokens, hidden, o.fp8);
            rejected += run_pattern<Pattern::ResidualRmsNormFp8Dynamic, T>(ws, b, stream.s, r, tokens, hidden,
                                                                           o.fp8_dynamic);
            if (!rejected.empty()) throw std::runtime_error("unexpected rejection: " + rejected);
            o.nvfp4_rejection = run_pattern<Pattern::ResidualRmsNormNvfp4, T>(ws, b, stream.s, r, tokens, hidden, o.nvfp4);
          } catch (const std::exception& e) {
            failure = e.what();
          }
          boot.barrier();  // every rank's last collective was issued before any communicator is destroyed
        }
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

// With several ranks NCCL's summation order is its own: the sum must be within the documented bound of the
// exact sum, identical on every rank, and the epilogue bit-exact against that sum (residual add) or within
// one rounding of T (the norm).
template <class T>
void check_against_nccl_sum(int world, int tokens, int hidden, const std::vector<RankResults<T>>& results) {
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, 0, false));
  const auto exact = fiar_test::exact_sum(inputs, count);
  const std::vector<T>& sum = results[0].all_reduce.out;
  const std::vector<T> residual = fiar_test::residual_of<T>(count, 0);
  const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
  int differ = 0, out_of_bound = 0, residual_wrong = 0, norm_far = 0;
  for (int r = 1; r < world; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      differ += bits(results[static_cast<std::size_t>(r)].all_reduce.out[i]) != bits(sum[i]);
      differ += bits(results[static_cast<std::size_t>(r)].norm.residual_out[i]) != bits(results[0].norm.residual_out[i]);
      differ += bits(results[static_cast<std::size_t>(r)].norm.norm_out[i]) != bits(results[0].norm.norm_out[i]);
    }
    differ += results[static_cast<std::size_t>(r)].fp8.quant != results[0].fp8.quant;
    differ += results[static_cast<std::size_t>(r)].fp8_dynamic.quant != results[0].fp8_dynamic.quant;
    differ += results[static_cast<std::size_t>(r)].fp8_dynamic.scale_out != results[0].fp8_dynamic.scale_out;
  }
  for (int t = 0; t < tokens; ++t) {
    double squares = 0;
    std::vector<float> y(static_cast<std::size_t>(hidden));
    for (int h = 0; h < hidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * hidden + h;
      double abs_sum = 0;
      for (const auto& in : inputs) abs_sum += std::fabs(static_cast<double>(as_float(in[i])));
      out_of_bound += std::fabs(as_float(sum[i]) - exact[i]) > fiar_test::error_bound<T>(exact[i], abs_sum, world);
      const T want = from_float<T>(as_float(sum[i]) + as_float(residual[i]));
      residual_wrong += bits(results[0].norm.residual_out[i]) != bits(want);
      y[static_cast<std::size_t>(h)] = as_float(want);
      squares += static_cast<double>(y[static_cast<std::size_t>(h)]) * y[static_cast<std::size_t>(h)];
    }
    const double inv_rms = 1.0 / std::sqrt(squares / hidden + kEps);
    for (int h = 0; h < hidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * hidden + h;
      const double want = y[static_cast<std::size_t>(h)] * inv_rms * as_float(gamma[static_cast<std::size_t>(h)]);
      const double got = as_float(results[0].norm.norm_out[i]);
      norm_far += std::fabs(got - want) > 2 * fiar_test::unit_roundoff<T>() * std::fabs(want) + 1e-6 * std::fabs(want) + 1e-30;
    }
  }
  CHECK(differ == 0);
  CHECK(out_of_bound == 0);
  CHECK(residual_wrong == 0);
  CHECK(norm_far == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("nccl: allreduce and every fused pattern, one rank per GPU, against the references",
                   "[gpu][nccl]", float, __half, __nv_bfloat16) {
  const int world = gpu_world();
  const int hidden = GENERATE(2048, 16 * 19);
  const int tokens = GENERATE(3, 130);
  INFO("world " << world << " (one rank per GPU), " << fiar_test::dtype_label<TestType>() << ", hidden " << hidden
                << ", tokens " << tokens);
  const auto results = run_all_patterns<TestType>(world, tokens, hidden);
  // NVFP4: sm_100+ with 16-bit input; rejected (alike on every rank) otherwise.
  const int arch = device_arch(0);
  for (int r = 0; r < world; ++r) {
    const std::string& rejection = results[static_cast<std::size_t>(r)].nvfp4_rejection;
    CAPTURE(r, rejection);
    if (std::is_same_v<TestType, float>) {
      CHECK(rejection.find("NVFP4 takes 16-bit input") != std::string::npos);
    } else if (arch < 100) {
      CHECK(rejection.find("NVFP4 needs sm_100 or newer") != std::string::npos);
    } else {
      CHECK(rejection.empty());
    }
  }
  const fiar_test::Shape s{world, tokens, hidden};
  std::vector<fiar_test::Outputs<TestType>> all_reduce, norm, fp8, fp8_dynamic, nvfp4;
  for (const auto& r : results) {
    all_reduce.push_back(r.all_reduce);
    norm.push_back(r.norm);
    fp8.push_back(r.fp8);
    fp8_dynamic.push_back(r.fp8_dynamic);
    nvfp4.push_back(r.nvfp4);
  }
  if (world == 1) {
    // One rank: NCCL copies the input, so fiar's rank-order reference holds bit for bit.
    fiar_test::check_pattern<Pattern::AllReduce, TestType>(s, all_reduce, false, {}, 0.0f, kScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNorm, TestType>(s, norm, true, {}, 0.0f, kScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNormFp8, TestType>(s, fp8, true, {}, 0.0f, kScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, fp8_dynamic, true, {}, 0.0f, kScale);
    if (!std::is_same_v<TestType, float> && arch >= 100) {
      fiar_test::check_pattern<Pattern::ResidualRmsNormNvfp4, TestType>(s, nvfp4, true, fiar::ScaleLayout::Swizzled128x4,
                                                                        0.0f, kScale);
    }
  } else {
    check_against_nccl_sum<TestType>(world, tokens, hidden, results);
  }
}

TEST_CASE("nccl: an adopted communicator, NcclBootstrap as the bootstrap, and calls captured in a CUDA graph",
          "[gpu][nccl]") {
  const int world = gpu_world();
  const int tokens = 5, hidden = 1024;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(world), nullptr);
  std::vector<int> devices(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) devices[static_cast<std::size_t>(r)] = r;
  REQUIRE(ncclCommInitAll(comms.data(), world, devices.data()) == ncclSuccess);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::vector<__nv_bfloat16>> eager(static_cast<std::size_t>(world)), graphed(static_cast<std::size_t>(world));
  std::vector<std::vector<int>> gathered(static_cast<std::size_t>(world));
  std::vector<int> owns(static_cast<std::size_t>(world), -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GPU_CHECK(cudaSetDevice(r));
        fiar::NcclBootstrap boot(comms[static_cast<std::size_t>(r)], 60s);
        gathered[static_cast<std::size_t>(r)] = fiar::all_gather_value(boot, 100 + boot.rank());
        boot.barrier();
        const fiar::Topology topo = fiar::discover_topology(boot);
        Stream stream;
        DeviceBuffer<__nv_bfloat16> in(count), out(count);
        const auto host = fiar_test::make_input<__nv_bfloat16>(count, r, 3, false);
        GPU_CHECK(cudaMemcpy(in.p, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
        GPU_CHECK(cudaDeviceSynchronize());  // the legacy stream's copy, before the non-blocking stream reads it
        {
          fiar::WorkspaceConfig cfg;
          cfg.max_token_num = tokens;
          cfg.hidden_dim = hidden;
          cfg.timeout = 60s;
          NcclWorkspace<__nv_bfloat16> ws(boot, comms[static_cast<std::size_t>(r)], topo, cfg);
          owns[static_cast<std::size_t>(r)] = ws.owns_comm() ? 1 : 0;
          ws.allreduce(in.p, out.p, tokens, stream.s);
          GPU_CHECK(cudaStreamSynchronize(stream.s));
          download(eager[static_cast<std::size_t>(r)], out.p, count);
          GPU_CHECK(cudaMemsetAsync(out.p, 0, count * sizeof(__nv_bfloat16), stream.s));
          // The same call captured into a graph (not timed by check(); replayed twice).
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          GPU_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
          ws.allreduce(in.p, out.p, tokens, stream.s);
          GPU_CHECK(cudaStreamEndCapture(stream.s, &graph));
          GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          GPU_CHECK(cudaGraphLaunch(exec, stream.s));
          GPU_CHECK(cudaGraphLaunch(exec, stream.s));
          GPU_CHECK(cudaStreamSynchronize(stream.s));
          download(graphed[static_cast<std::size_t>(r)], out.p, count);
          ws.check();
          (void)cudaGraphExecDestroy(exec);
          (void)cudaGraphDestroy(graph);
          boot.barrier();
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto comm : comms) (void)ncclCommDestroy(comm);
  for (int r = 0; r < world; ++r) {
    CAPTURE(world, r);
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    CHECK(owns[static_cast<std::size_t>(r)] == 0);
    std::vector<int> expect;
    for (int q = 0; q < world; ++q) expect.push_back(100 + q);
    CHECK(gathered[static_cast<std::size_t>(r)] == expect);
    const auto& e = eager[static_cast<std::size_t>(r)];
    const auto& g = graphed[static_cast<std::size_t>(r)];
    int differ = 0;
    for (std::size_t i = 0; i < count; ++i) differ += bits(e[i]) != bits(g[i]) || bits(e[i]) != bits(eager[0][i]);
    CHECK(differ == 0);
  }
  if (world == 1) {
    const auto expect = fiar_test::rank_order_sum<__nv_bfloat16>({fiar_test::make_input<__nv_bfloat16>(count, 0, 3, false)}, count);
    int wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += bits(eager[0][i]) != bits(expect[i]);
    CHECK(wrong == 0);
  }
}
