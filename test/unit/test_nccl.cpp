// The nccl backend on the host emulator (a plain host reduction among the emulated ranks, then the fused
// epilogue as a pass of its own): results against the same independent references as the trtllm tests,
// every fused pattern, in-place calls, long call sequences, validation, bounded waits, collective creation,
// multi-node topologies; and the CUDA workspace's behaviour on a machine without a GPU (or with one).
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::NcclPolicy;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::kSmallGrid;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;

namespace {

template <class T>
using HostNccl = fiar_test::HostWorkspace<T, NcclPolicy>;

// nccl runs anywhere: by default a group of two nodes without peer access, which no other backend accepts.
fiar::Topology anywhere(int world, int rank, int arch = 90) {
  return fiar::Topology{.world_size = world, .rank = rank, .node_count = world > 1 ? 2 : 1, .node_peer_access = false,
                        .arch = arch};
}

// The harness's all-reduce check (every result of every rank against the rank-order reference and the
// documented bound of the exact sum) with Strategy::Auto, the only one nccl takes, which every call reports.
template <class T>
void run_and_check(int world, const fiar::WorkspaceConfig& cfg, int calls, const std::function<int(int)>& tokens_of,
                   bool in_place = false, fiar_test::TopologyOf topo_of = anywhere) {
  const auto ran = fiar_test::run_and_check<T, NcclPolicy>(
      world, cfg, calls, tokens_of, [](int) { return Strategy::Auto; }, in_place, /*specials=*/true, topo_of);
  for (Strategy s : ran) CHECK(s == Strategy::Auto);
}

// The harness's fused-pattern check (test_fusion.cpp's tensors and reference) with Strategy::Auto.
template <Pattern P, class T>
void check_fused(const fiar_test::Shape& s, bool with_norm_out,
                 fiar::ScaleLayout layout = fiar::ScaleLayout::Swizzled128x4, float weight_bias = 0.0f,
                 float scale = 0.75f, bool in_place = false) {
  fiar_test::run_and_check<P, T, NcclPolicy>(s, Strategy::Auto, with_norm_out, layout, weight_bias, scale, in_place,
                                             anywhere);
}

}  // namespace

TEMPLATE_TEST_CASE("nccl allreduce matches the rank-order reference bit for bit", "[nccl]", float, __half,
                   __nv_bfloat16) {
  const int world = GENERATE(1, 2, 4, 8);
  CAPTURE(world, fiar_test::dtype_label<TestType>());
  const fiar::WorkspaceConfig cfg{.max_token_num = 9, .hidden_dim = 48};
  run_and_check<TestType>(world, cfg, 4, [](int c) { return 1 + (c * 5) % 9; });
}

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
  if constexpr (sizeof(TestType) == 2) {
    check_fused<Pattern::ResidualRmsNormNvfp4, TestType>(s, true);
    check_fused<Pattern::ResidualRmsNormNvfp4, TestType>(s, false, fiar::ScaleLayout::Linear);
  }
}

TEST_CASE("nccl: NVFP4 swizzled padding rows past 128 tokens", "[nccl]") {
  check_fused<Pattern::ResidualRmsNormNvfp4, __nv_bfloat16>({2, 130, 64}, true, fiar::ScaleLayout::Swizzled128x4,
                                                            0.0f, 336.0f);
}

TEST_CASE("nccl: in place (out == in; norm_out == in, residual_out == residual_in)", "[nccl]") {
  run_and_check<__half>(4, {.max_token_num = 6, .hidden_dim = 32}, 3, [](int c) { return 4 + c; }, true);
  check_fused<Pattern::AllReduce, float>({4, 6, 256}, false, {}, 0.0f, 1.0f, true);
  check_fused<Pattern::ResidualRmsNorm, __nv_bfloat16>({4, 6, 256}, true, {}, 0.0f, 1.0f, true);
  check_fused<Pattern::ResidualRmsNormFp8Dynamic, float>({2, 6, 256}, true, {}, 0.0f, 1.0f, true);
  check_fused<Pattern::ResidualRmsNormNvfp4, __half>({2, 6, 256}, true, {}, 0.0f, 100.0f, true);
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
  run_and_check<float>(3, {.max_token_num = 5, .hidden_dim = 8}, 3, [](int c) { return 3 + c; }, false,
                       [](int world, int rank, int) {
                         return fiar::Topology{.world_size = world, .rank = rank, .node_count = 3,
                                               .node_peer_access = false, .arch = 0};
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

TEST_CASE("nccl: bad calls are rejected before anything runs, and the workspace still works", "[nccl]") {
  const int world = 2;
  std::vector<std::vector<std::string>> messages(world);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostNccl<float> ws(boot, anywhere(world, rank), {.max_token_num = 8, .hidden_dim = 16}, kSmallGrid);
    alignas(16) static thread_local float in[8 * 16 + 4], out[8 * 16 + 4], res[8 * 16], gamma[16];
    auto& m = messages[static_cast<std::size_t>(rank)];
    auto reject = [&](auto&& f) { m.push_back(fiar_test::thrown<std::invalid_argument>(f, "(accepted)")); };
    reject([&] { ws.allreduce(in, out, 4, nullptr, Strategy::OneShot); });
    reject([&] { ws.allreduce(in, out, 4, nullptr, Strategy::TwoShot); });
    reject([&] { ws.allreduce(in, out, 0); });
    reject([&] { ws.allreduce(in, out, 9); });
    reject([&] { ws.allreduce(nullptr, out, 1); });
    reject([&] { ws.allreduce(in, nullptr, 1); });
    reject([&] { ws.allreduce(in + 1, out, 1); });
    reject([&] { ws.allreduce(in, in + 4, 1); });
    fiar::FusedArgs<float> a;
    a.in = in;
    a.num_tokens = 2;
    a.residual_in = res;
    a.residual_out = res;
    a.gamma = gamma;  // norm_out missing
    reject([&] { ws.run<Pattern::ResidualRmsNorm>(a); });
    // Nothing ran: the barriers' sequence is intact and a valid call reduces correctly.
    std::fill(in, in + 8 * 16, static_cast<float>(rank + 1));
    ws.allreduce(in, out, 8);
    wrong[static_cast<std::size_t>(rank)] =
        static_cast<int>(std::count_if(out, out + 8 * 16, [](float x) { return x != 3.0f; }));
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    const auto& m = messages[static_cast<std::size_t>(r)];
    REQUIRE(m.size() == 9);
    CHECK(m[0].find("allreduce on rank " + std::to_string(r) + ": strategy oneshot") != std::string::npos);
    CHECK(m[0].find("the nccl backend has no one-shot / two-shot choice") != std::string::npos);
    CHECK(m[0].find("Fix: pass Strategy::Auto") != std::string::npos);
    CHECK(m[1].find("strategy twoshot") != std::string::npos);
    CHECK(m[2].find("num_tokens = 0; allowed: 1 to max_token_num = 8") != std::string::npos);
    CHECK(m[3].find("num_tokens = 9; allowed: 1 to max_token_num = 8") != std::string::npos);
    CHECK(m[4].find("in is a null pointer") != std::string::npos);
    CHECK(m[5].find("out is a null pointer") != std::string::npos);
    CHECK(m[6].find("not 16-byte aligned") != std::string::npos);
    CHECK(m[7].find("overlaps in (") != std::string::npos);
    CHECK(m[8].find("norm_out is a null pointer; residual_rmsnorm needs it") != std::string::npos);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("nccl: a rank that never calls: the others get timeout_error naming it, then stay failed", "[nccl]") {
  const int world = 4;
  std::vector<fiar_test::AfterPeerStopped> seen(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    HostNccl<float> ws(boot, anywhere(world, rank), {.max_token_num = 4, .hidden_dim = 16, .timeout = 300ms},
                       kSmallGrid);
    std::vector<float> in(64, 1.0f), out(64);
    const auto call = [&] { ws.allreduce(in.data(), out.data(), 4); };
    call();                 // call 0: everyone
    if (rank == 3) return;  // call 1: rank 3 never arrives
    seen[static_cast<std::size_t>(rank)] = fiar_test::after_peer_stopped(ws, call);
  });
  require_no_errors(errors);
  for (int r = 0; r < 3; ++r) {
    const auto& s = seen[static_cast<std::size_t>(r)];
    CAPTURE(r, s.first);
    CHECK(s.first.find("nccl all-reduce on rank " + std::to_string(r) +
                       " gave up after 300 ms waiting for the input of rank(s) 3 (call 1)") != std::string::npos);
    CHECK(s.later == s.first);
    CHECK(s.checked == s.first);
    CHECK(s.took >= 300ms);
    CHECK(s.took < 10s);
  }
}

TEST_CASE("nccl: creation is collective: one rank's objection or a differing configuration fails every rank",
          "[nccl]") {
  const int world = 3;
  SECTION("a configuration one rank rejects") {
    auto errors = run_ranks(world, [](int rank, fiar::InProcessBootstrap& boot) {
      const int hidden = rank == 1 ? 7 : 16;
      HostNccl<float> ws(boot, anywhere(world, rank), {.max_token_num = 4, .hidden_dim = hidden}, kSmallGrid);
    });
    CHECK(errors[1].find("WorkspaceConfig::hidden_dim = 7 for float") != std::string::npos);
    for (int r : {0, 2}) {
      CHECK(errors[static_cast<std::size_t>(r)].find("workspace creation failed because rank 1 rejected it: "
                                                     "WorkspaceConfig::hidden_dim = 7") != std::string::npos);
    }
  }
  SECTION("configurations that differ") {
    auto errors = run_ranks(world, [](int rank, fiar::InProcessBootstrap& boot) {
      const int tokens = rank == 2 ? 8 : 4;
      HostNccl<float> ws(boot, anywhere(world, rank), {.max_token_num = tokens, .hidden_dim = 16}, kSmallGrid);
    });
    for (const auto& e : errors) {
      CHECK(e.find("workspace configurations differ between ranks") != std::string::npos);
      CHECK(e.find("rank 2 has {backend nccl") != std::string::npos);
      CHECK(e == errors[0]);
    }
  }
  SECTION("a topology that does not match the bootstrap") {
    auto errors = run_ranks(world, [](int rank, fiar::InProcessBootstrap& boot) {
      HostNccl<float> ws(boot, anywhere(world, rank == 0 ? 1 : rank), {.max_token_num = 4, .hidden_dim = 16},
                         kSmallGrid);
    });
    CHECK(errors[0].find("the topology says world_size 3, rank 1, but the bootstrap says size 3, rank 0") !=
          std::string::npos);
    CHECK(errors[1].find("rejected it") != std::string::npos);
    CHECK(errors[2].find("rejected it") != std::string::npos);
  }
  SECTION("an invalid emulator grid") {
    auto errors = run_ranks(world, [](int rank, fiar::InProcessBootstrap& boot) {
      HostNccl<float> ws(boot, anywhere(world, rank), {.max_token_num = 4, .hidden_dim = 16},
                         fiar::HostPlatformOptions{.blocks = rank == 2 ? 0 : 2, .lanes = 4});
    });
    CHECK(errors[2].find("host emulator grid of 0 blocks") != std::string::npos);
    CHECK(errors[0].find("HostPlatform setup failed on rank 2") != std::string::npos);
  }
}

TEST_CASE("nccl: a moved workspace keeps working; the moved-from one refuses calls", "[nccl]") {
  auto errors = run_ranks(2, [](int rank, fiar::InProcessBootstrap& boot) {
    HostNccl<float> a(boot, anywhere(2, rank), {.max_token_num = 2, .hidden_dim = 4}, kSmallGrid);
    std::vector<float> in(8, 1.0f), out(8);
    a.allreduce(in.data(), out.data(), 2);
    HostNccl<float> b(std::move(a));
    b.allreduce(in.data(), out.data(), 2);
    FIAR_ENSURE(out[7] == 2.0f);
    FIAR_ENSURE_THROWS_AS(a.check(), std::logic_error);
    HostNccl<float> c(boot, anywhere(2, rank), {.max_token_num = 2, .hidden_dim = 4}, kSmallGrid);
    c = std::move(b);
    c.allreduce(in.data(), out.data(), 2);
    FIAR_ENSURE(out[0] == 2.0f);
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
