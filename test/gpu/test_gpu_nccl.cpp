// SPDX-License-Identifier: Apache-2.0
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
using fiar_test::as_float;
using fiar_test::bits;
using fiar_test::DeviceBuffer;
using fiar_test::from_float;
using fiar_test::Stream;

namespace {

template <class T>
using NcclWorkspace = fiar_test::GpuWorkspace<fiar::NcclPolicy, T>;

constexpr float kNcclScale = 0.75f;

// One rank per visible GPU, at most 8.
int gpu_world() {
  int n = 0;
  GPU_CHECK(cudaGetDeviceCount(&n));
  return std::clamp(n, 1, 8);
}

// Everything one rank produced: each pattern's outputs (or its rejection).
template <class T>
struct RankResults {
  fiar_test::Outputs<T> all_reduce, norm, fp8, fp8_dynamic, nvfp4;
  std::string nvfp4_rejection;
};

// Every pattern on every rank (one per GPU), with communicators the workspaces create; each call with the host
// tests' tensors (fiar_test::run_fused) and Strategy::Auto.
template <class T>
std::vector<RankResults<T>> run_all_patterns(int world, int tokens, int hidden) {
  return fiar_test::on_ranks(
      fiar_test::one_rank_per_gpu(world),
      [&](int rank, fiar::InProcessBootstrap& boot) {
        Stream stream;
        fiar_test::FusedBuffers<T> b(tokens, hidden,
                                     fiar::algo::nvfp4_scale_bytes(tokens, hidden, fiar::ScaleLayout::Swizzled128x4));
        b.set_constants(hidden, kNcclScale, stream.s);
        RankResults<T> o;
        NcclWorkspace<T> ws(boot, fiar::discover_topology(boot),
                            {.max_token_num = tokens, .hidden_dim = hidden, .timeout = 60s});
        // Every rank's last collective was issued before any communicator is destroyed.
        fiar_test::finish_together(boot, [&] {
          const fiar_test::FusedCall call{.tokens = tokens};
          std::string rejected;  // none of these may be rejected
          auto run = [&](auto pattern, fiar_test::Outputs<T>& into) {
            auto got = fiar_test::run_fused<decltype(pattern)::value>(ws, b, stream.s, rank, hidden, call);
            into = std::move(got.outputs);
            return got.rejection;
          };
          rejected += run(std::integral_constant<Pattern, Pattern::AllReduce>{}, o.all_reduce);
          rejected += run(std::integral_constant<Pattern, Pattern::ResidualRmsNorm>{}, o.norm);
          rejected += run(std::integral_constant<Pattern, Pattern::ResidualRmsNormFp8>{}, o.fp8);
          rejected += run(std::integral_constant<Pattern, Pattern::ResidualRmsNormFp8Dynamic>{}, o.fp8_dynamic);
          if (!rejected.empty()) throw std::runtime_error("unexpected rejection: " + rejected);
          o.nvfp4_rejection = run(std::integral_constant<Pattern, Pattern::ResidualRmsNormNvfp4>{}, o.nvfp4);
        });
        return o;
      },
      120s);
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
      differ +=
          bits(results[static_cast<std::size_t>(r)].norm.residual_out[i]) != bits(results[0].norm.residual_out[i]);
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
    const double inv_rms = 1.0 / std::sqrt(squares / hidden + fiar_test::kFusedEps);
    for (int h = 0; h < hidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * hidden + h;
      const double want = y[static_cast<std::size_t>(h)] * inv_rms * as_float(gamma[static_cast<std::size_t>(h)]);
      const double got = as_float(results[0].norm.norm_out[i]);
      norm_far +=
          std::fabs(got - want) > 2 * fiar_test::unit_roundoff<T>() * std::fabs(want) + 1e-6 * std::fabs(want) + 1e-30;
    }
  }
  CHECK(differ == 0);
  CHECK(out_of_bound == 0);
  CHECK(residual_wrong == 0);
  CHECK(norm_far == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("nccl: allreduce and every fused pattern, one rank per GPU, against the references", "[gpu][nccl]",
                   float, __half, __nv_bfloat16) {
  const int world = gpu_world();
  const int hidden = GENERATE(2048, 16 * 19);
  const int tokens = GENERATE(3, 130);
  INFO("world " << world << " (one rank per GPU), " << fiar_test::dtype_label<TestType>() << ", hidden " << hidden
                << ", tokens " << tokens);
  const auto results = run_all_patterns<TestType>(world, tokens, hidden);
  // NVFP4: sm_100+ with 16-bit input; rejected (alike on every rank) otherwise.
  const int arch = fiar_test::device_arch(0);
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
    fiar_test::check_pattern<Pattern::AllReduce, TestType>(s, all_reduce, false, {}, 0.0f, kNcclScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNorm, TestType>(s, norm, true, {}, 0.0f, kNcclScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNormFp8, TestType>(s, fp8, true, {}, 0.0f, kNcclScale);
    fiar_test::check_pattern<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, fp8_dynamic, true, {}, 0.0f, kNcclScale);
    if (!std::is_same_v<TestType, float> && arch >= 100) {
      fiar_test::check_pattern<Pattern::ResidualRmsNormNvfp4, TestType>(
          s, nvfp4, true, fiar::ScaleLayout::Swizzled128x4, 0.0f, kNcclScale);
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
  const std::vector<int> devices = fiar_test::one_rank_per_gpu(world);
  // The communicators, destroyed once every rank has finished (also when the test leaves early).
  struct Comms {
    std::vector<ncclComm_t> c;
    Comms(const Comms&) = delete;
    Comms& operator=(const Comms&) = delete;
    explicit Comms(int world) : c(static_cast<std::size_t>(world), nullptr) {}
    ~Comms() {
      for (auto comm : c) {
        if (comm != nullptr) (void)ncclCommDestroy(comm);
      }
    }
  } comms(world);
  REQUIRE(ncclCommInitAll(comms.c.data(), world, devices.data()) == ncclSuccess);
  struct Seen {
    std::vector<int> gathered;  ///< all_gather_value over NcclBootstrap
    std::vector<__nv_bfloat16> eager, graphed;
    int owns = -1;  ///< owns_comm()
  };
  // The ranks meet through NcclBootstrap over the adopted communicator, not the InProcessBootstrap they are given.
  const auto seen = fiar_test::on_ranks(devices, [&](int r, fiar::InProcessBootstrap&) {
    Seen mine;
    fiar::NcclBootstrap boot(comms.c[static_cast<std::size_t>(r)], 60s);
    mine.gathered = fiar::all_gather_value(boot, 100 + boot.rank());
    boot.barrier();
    const fiar::Topology topo = fiar::discover_topology(boot);
    Stream stream;
    DeviceBuffer<__nv_bfloat16> in(count), out(count);
    const auto host = fiar_test::make_input<__nv_bfloat16>(count, r, 3, false);
    GPU_CHECK(cudaMemcpy(in.p, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaDeviceSynchronize());  // the legacy stream's copy, before the non-blocking stream reads it
    {
      NcclWorkspace<__nv_bfloat16> ws(boot, comms.c[static_cast<std::size_t>(r)], topo,
                                      {.max_token_num = tokens, .hidden_dim = hidden, .timeout = 60s});
      mine.owns = ws.owns_comm() ? 1 : 0;
      ws.allreduce(in.p, out.p, tokens, stream.s);
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      fiar_test::download(mine.eager, out.p, count);
      GPU_CHECK(cudaMemsetAsync(out.p, 0, count * sizeof(__nv_bfloat16), stream.s));
      // The same call captured into a graph (not timed by check(); replayed twice).
      {
        const fiar_test::CapturedGraph graph(stream.s, [&] { ws.allreduce(in.p, out.p, tokens, stream.s); });
        graph.launch(stream.s);
        graph.launch(stream.s);
        GPU_CHECK(cudaStreamSynchronize(stream.s));
        fiar_test::download(mine.graphed, out.p, count);
        ws.check();
      }
      boot.barrier();
    }
    return mine;
  });
  const auto& eager0 = seen[0].eager;
  for (int r = 0; r < world; ++r) {
    CAPTURE(world, r);
    const Seen& got = seen[static_cast<std::size_t>(r)];
    CHECK(got.owns == 0);
    std::vector<int> expect;
    for (int q = 0; q < world; ++q) expect.push_back(100 + q);
    CHECK(got.gathered == expect);
    int differ = 0;
    for (std::size_t i = 0; i < count; ++i) {
      differ += bits(got.eager[i]) != bits(got.graphed[i]) || bits(got.eager[i]) != bits(eager0[i]);
    }
    CHECK(differ == 0);
  }
  if (world == 1) {
    const auto expect =
        fiar_test::rank_order_sum<__nv_bfloat16>({fiar_test::make_input<__nv_bfloat16>(count, 0, 3, false)}, count);
    int wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += bits(eager0[i]) != bits(expect[i]);
    CHECK(wrong == 0);
  }
}

TEST_CASE(
    "nccl route: ranks sharing one GPU go without the table's route (two-shot instead), and an explicit route "
    "fails the creation on every rank",
    "[gpu][nccl]") {
  // NCCL refuses two ranks of one communicator on one GPU, on every rank alike.
  const std::vector<int> devices = fiar_test::ranks_on_gpu(8);
  const int hidden = 8192;
  const int tokens = 2048;  // 2048 x 8192 bf16 = 32 MiB per rank: the table's NCCL step at 8 ranks on sm_90 / sm_100
  struct Seen {
    bool route = true;
    std::string reason;
    Strategy ran = Strategy::Auto;
    float first = 0, last = 0;
  };
  const auto seen = fiar_test::on_ranks(devices, [&](int r, fiar::InProcessBootstrap& boot) {
    Seen mine;
    const fiar::Topology topo = fiar::discover_topology(boot);
    const fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .timeout = 60s};
    fiar_test::GpuWorkspace<fiar::TrtllmPolicy, __nv_bfloat16> ws(boot, topo, cfg);
    mine.route = ws.has_nccl_route();
    mine.reason = ws.nccl_route_reason();
    const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
    const std::vector<__nv_bfloat16> host(count, from_float<__nv_bfloat16>(static_cast<float>(r + 1)));
    DeviceBuffer<__nv_bfloat16> in(count), out(count);
    GPU_CHECK(cudaMemcpy(in.p, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    fiar_test::finish_together(boot, [&] {
      Stream stream;
      ws.allreduce(in.p, out.p, tokens, stream.s);
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      ws.check();
    });
    mine.ran = ws.last_strategy();
    std::vector<__nv_bfloat16> got;
    fiar_test::download(got, out.p, count);
    mine.first = as_float(got.front());
    mine.last = as_float(got.back());
    return mine;
  });
  for (std::size_t r = 0; r < seen.size(); ++r) {
    CAPTURE(r, seen[r].reason);
    CHECK_FALSE(seen[r].route);
    CHECK_THAT(seen[r].reason, Catch::Contains("setting it up failed"));
    CHECK(seen[r].ran == Strategy::TwoShot);
    CHECK(seen[r].first == 36.0f);  // 1 + 2 + ... + 8
    CHECK(seen[r].last == 36.0f);
  }
  // Asked for explicitly, the same failure fails the creation, on every rank, without waiting for the timeout.
  const auto start = std::chrono::steady_clock::now();
  const auto errors = fiar_test::run_ranks_on(fiar_test::ranks_on_gpu(2), [&](int, fiar::InProcessBootstrap& boot) {
    const fiar::Topology topo = fiar::discover_topology(boot);
    const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 1024, .timeout = 60s, .nccl_min_bytes = 0};
    fiar_test::GpuWorkspace<fiar::TrtllmPolicy, __nv_bfloat16> ws(boot, topo, cfg);
  });
  for (const std::string& e : errors) CHECK_FALSE(e.empty());
  CHECK(std::chrono::steady_clock::now() - start < 50s);
}
