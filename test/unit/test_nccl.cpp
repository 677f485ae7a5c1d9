// SPDX-License-Identifier: Apache-2.0
// What is particular to the nccl backend on the host emulator (a plain host reduction among the emulated ranks, then
// the fused epilogue as a pass of its own): every fused pattern, NVFP4 row padding, a long call sequence, topologies
// no other backend accepts, its sizing; and the CUDA workspace's behaviour on a machine without a GPU (or with one).
// What every backend does (results, aliasing, validation, creation, timeouts) is tested once for all in
// test_backends.cpp.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "../common/cases.hpp"
#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::NcclPolicy;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::anywhere;
using fiar_test::kSmallGrid;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;

namespace {

template <class T>
using HostNccl = fiar_test::HostWorkspace<T, NcclPolicy>;

// The harness's all-reduce check (every result of every rank against the rank-order reference and the
// documented bound of the exact sum) with Strategy::Auto, the only one nccl takes, which every call reports. By
// default the ranks run on fiar_test::anywhere: two nodes without peer access, which no other backend accepts.
template <class T>
void run_and_check(int world, const fiar::WorkspaceConfig& cfg, int calls, const std::function<int(int)>& tokens_of,
                   fiar_test::TopologyOf topo_of = anywhere) {
  const auto ran = fiar_test::run_and_check<T, NcclPolicy>(
      world, cfg, calls, tokens_of, [](int) { return Strategy::Auto; }, /*in_place=*/false, /*specials=*/true, topo_of);
  for (Strategy s : ran) CHECK(s == Strategy::Auto);
}

// The harness's fused-pattern check (test_fusion.cpp's tensors and reference) with Strategy::Auto.
template <Pattern P, class T>
void check_fused(const fiar_test::Shape& s, bool with_norm_out, const fiar_test::QuantOptions& quant = {},
                 float weight_bias = 0.0f, float scale = 0.75f) {
  fiar_test::run_and_check<P, T, NcclPolicy>(s, Strategy::Auto, with_norm_out, quant, weight_bias, scale,
                                             /*in_place=*/false, anywhere);
}

}  // namespace

TEMPLATE_TEST_CASE("nccl: every fused pattern matches the reference", "[nccl]", float, __half, __nv_bfloat16) {
  const int world = GENERATE(2, 4);
  const int hidden = GENERATE(256, 16 * 19);
  const fiar_test::Shape s{world, 3, hidden};
  check_fused<Pattern::AllReduce, TestType>(s, false);
  check_fused<Pattern::ResidualRmsNorm, TestType>(s, true);
  check_fused<Pattern::ResidualRmsNormFp8, TestType>(s, true);
  check_fused<Pattern::ResidualRmsNormFp8, TestType>(s, false, {}, 1.0f, 0.02f);
  check_fused<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, true);
  check_fused<Pattern::ResidualRmsNormFp8Dynamic, TestType>(s, false);
  check_fused<Pattern::ResidualRmsNormFp8Group, TestType>(s, true,
                                                          fiar_test::QuantOptions(0, fiar::GroupScale::Float32));
  if (hidden % 32 == 0) check_fused<Pattern::ResidualRmsNormMxfp8, TestType>(s, true, fiar::ScaleLayout::Linear);
  check_fused<Pattern::MoeFinalizeAllReduce, TestType>(s, false, fiar_test::QuantOptions::moe(8, true));
  check_fused<Pattern::MoeFinalizeResidualRmsNorm, TestType>(s, true, fiar_test::QuantOptions::moe(6, false, 2.5f));
  if constexpr (sizeof(TestType) == 2) {
    check_fused<Pattern::ResidualRmsNormNvfp4, TestType>(s, true);
    check_fused<Pattern::ResidualRmsNormNvfp4, TestType>(s, false, fiar::ScaleLayout::Linear);
  }
}

TEST_CASE("nccl: NVFP4 swizzled padding rows past 128 tokens", "[nccl]") {
  check_fused<Pattern::ResidualRmsNormNvfp4, __nv_bfloat16>({2, 130, 64}, true, fiar::ScaleLayout::Swizzled128x4, 0.0f,
                                                            336.0f);
}

TEST_CASE("nccl: 50 consecutive calls with changing num_tokens", "[nccl]") {
  run_and_check<__nv_bfloat16>(4, {.max_token_num = 24, .hidden_dim = 16}, 50,
                               [](int c) { return c % 10 == 9 ? 24 : 1 + (c * 7) % 13; });
}

TEST_CASE("nccl runs on any topology: several nodes, no peer access, any architecture", "[nccl]") {
  const fiar::Topology two_nodes{.world_size = 4, .rank = 0, .node_count = 2, .node_peer_access = false, .arch = 0};
  CHECK(HostNccl<float>::can_implement(two_nodes, {.max_token_num = 4, .hidden_dim = 8}));
  CHECK(HostNccl<float>::why_not(two_nodes, {.max_token_num = 4, .hidden_dim = 8}).empty());
  // 3 ranks on 3 nodes, unknown architecture: a shape no other backend accepts.
  run_and_check<float>(
      3, {.max_token_num = 5, .hidden_dim = 8}, 3, [](int c) { return 3 + c; },
      [](int world, int rank, int) {
        return fiar::Topology{.world_size = world, .rank = rank, .node_count = 3, .node_peer_access = false, .arch = 0};
      });
}

TEST_CASE("nccl: sizing, capacity and strategy", "[nccl]") {
  const fiar::WorkspaceConfig cfg{.max_token_num = 64, .hidden_dim = 7168};
  const fiar::Topology t8 = anywhere(8, 0);
  // The shared block (8 arrival words padded to 64 bytes + one input) and the local sum buffer.
  CHECK(HostNccl<__nv_bfloat16>::required_bytes(t8, cfg) == 64 + 2 * 64 * 7168 * 2);
  CHECK(fiar::Workspace<NcclPolicy, __nv_bfloat16, fiar::CudaPlatform>::required_bytes(t8, cfg) == 64 * 7168 * 2);
  CHECK(HostNccl<__nv_bfloat16>::why_not(t8, {.max_token_num = 64, .hidden_dim = 7}).find("hidden_dim = 7") !=
        std::string::npos);
  CHECK(HostNccl<float>::why_not(t8, {.max_token_num = 0, .hidden_dim = 8}).find("max_token_num = 0") !=
        std::string::npos);
  CHECK_FALSE(HostNccl<float>::can_implement(fiar::Topology{.world_size = 2, .rank = 5}, cfg));  // malformed
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostNccl<float> ws(boot, anywhere(2, rank), {.max_token_num = 8, .hidden_dim = 16}, kSmallGrid);
    FIAR_ENSURE(ws.strategy_for(1) == Strategy::Auto);
    FIAR_ENSURE(ws.strategy_for(8) == Strategy::Auto);
    FIAR_ENSURE(ws.is_buffer_size_sufficient(8));
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(9)));
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(0)));
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(4, Strategy::OneShot)));
    FIAR_ENSURE(!(ws.is_buffer_size_sufficient(4, Strategy::TwoShot)));
    FIAR_ENSURE(ws.arch() == 90);
    FIAR_ENSURE(ws.topology().world_size == 2);
    FIAR_ENSURE(ws.config().max_token_num == 8);
  });
  require_no_errors(errors);
}

TEST_CASE("nccl on CudaPlatform: without a GPU creation fails on every rank alike; with one it reduces", "[nccl]") {
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  const int world = gpu ? 1 : 2;  // NCCL puts one rank per GPU
  std::vector<std::string> kinds(static_cast<std::size_t>(world));
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 64, .timeout = 20s};
    try {
      fiar::Workspace<NcclPolicy, float, fiar::CudaPlatform> ws(boot, anywhere(world, rank), cfg);
      float* d = nullptr;
      std::vector<float> host(4 * 64), back(4 * 64, -1.0f);
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 7.0f;
      FIAR_ENSURE(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(float)) == cudaSuccess);
      FIAR_ENSURE(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
      ws.allreduce(d, d, 4);
      FIAR_ENSURE(cudaDeviceSynchronize() == cudaSuccess);
      ws.check();
      FIAR_ENSURE(cudaMemcpy(back.data(), d, back.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      cudaFree(d);
      kinds[static_cast<std::size_t>(rank)] = host == back ? "reduced" : "wrong result";
    } catch (const fiar::cuda_error& e) {
      kinds[static_cast<std::size_t>(rank)] = std::string("cuda_error: ") + e.what();
    } catch (const std::invalid_argument& e) {
      kinds[static_cast<std::size_t>(rank)] = std::string("invalid_argument: ") + e.what();
    }
  });
  require_no_errors(errors);
  for (const auto& k : kinds) {
    CAPTURE(k);
    if (!fiar::built_with_nccl) {
      CHECK(k.rfind("invalid_argument: fiar: ", 0) == 0);  // rank 0's own text, "... rank 0 rejected it: ..." elsewhere
      CHECK(k.find("Workspace<NcclPolicy, float, CudaPlatform> needs NCCL, but fiar was built without NCCL") !=
            std::string::npos);
      CHECK(k.find("-Dnccl=enabled") != std::string::npos);
    } else if (gpu) {
      CHECK(k == "reduced");
    } else {
      CHECK(k.rfind("cuda_error: fiar: ", 0) == 0);
    }
  }
#if FIAR_HAS_NCCL
  CHECK_THROWS_WITH(fiar::NcclBootstrap(nullptr), Catch::Contains("NcclBootstrap got a null ncclComm_t"));
#endif
}
