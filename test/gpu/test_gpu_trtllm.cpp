// The trtllm backend on real GPUs: ranks are threads of this process, each with its own non-blocking stream.
// Every result is compared bit for bit with the host rank-order reference (fp32 sum in rank order from +0,
// rounded with the CUDA conversions, -0 reported as +0), and every rank must hold the same bits.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Strategy;

namespace {

using fiar_test::DeviceBuffer;
using fiar_test::require_no_errors;
using fiar_test::run_ranks_on;
using fiar_test::Stream;

template <class T>
using GpuWorkspace = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::CudaPlatform>;


int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  return n;
}

// A sequence of calls every rank makes, in place, launched back to back on the rank's stream with nothing in
// between (so a fast rank runs a call ahead of a slow one and the buffer rotation is exercised), then
// synchronized once.
struct Plan {
  std::vector<int> devices;  ///< rank -> CUDA device
  int hidden = 0;
  std::vector<int> tokens;           ///< per call
  std::vector<Strategy> strategies;  ///< per call
  std::string label;
};

template <class T>
void run_and_check(const Plan& plan) {
  const int world = static_cast<int>(plan.devices.size());
  const int calls = static_cast<int>(plan.tokens.size());
  int max_tokens = 1;
  for (int t : plan.tokens) max_tokens = std::max(max_tokens, t);
  const std::size_t stride = static_cast<std::size_t>(max_tokens) * plan.hidden;
  INFO(plan.label << ": world " << world << ", " << fiar_test::dtype_label<T>() << ", hidden " << plan.hidden);

  // inputs[call][rank]; expected[call]
  std::vector<std::vector<std::vector<T>>> inputs(static_cast<std::size_t>(calls));
  std::vector<std::vector<T>> expected(static_cast<std::size_t>(calls));
  for (int c = 0; c < calls; ++c) {
    const std::size_t count = static_cast<std::size_t>(plan.tokens[static_cast<std::size_t>(c)]) * plan.hidden;
    for (int r = 0; r < world; ++r)
      inputs[static_cast<std::size_t>(c)].push_back(fiar_test::make_input<T>(count, r, c));
    expected[static_cast<std::size_t>(c)] = fiar_test::rank_order_sum(inputs[static_cast<std::size_t>(c)], count);
  }

  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(world));  // [rank], all calls back to back
  const auto errors = run_ranks_on(plan.devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    // Allocate before the workspace: its creation ends with a barrier, so no rank launches a kernel that
    // waits for a peer while that peer is still inside an allocation call.
    Stream stream;
    DeviceBuffer<T> data(stride * static_cast<std::size_t>(calls));
    for (int c = 0; c < calls; ++c) {
      const auto& in = inputs[static_cast<std::size_t>(c)][static_cast<std::size_t>(rank)];
      GPU_CHECK(cudaMemcpy(data.p + stride * static_cast<std::size_t>(c), in.data(), in.size() * sizeof(T),
                           cudaMemcpyHostToDevice));
    }
    const fiar::Topology topo = fiar::discover_topology(boot);
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = max_tokens;
    cfg.hidden_dim = plan.hidden;
    cfg.oneshot_at_max_tokens = true;
    cfg.timeout = 20s;
    GpuWorkspace<T> ws(boot, topo, cfg);
    for (int c = 0; c < calls; ++c) {
      T* region = data.p + stride * static_cast<std::size_t>(c);
      ws.allreduce(region, region, plan.tokens[static_cast<std::size_t>(c)], stream.s,
                   plan.strategies[static_cast<std::size_t>(c)]);
    }
    auto& out = outputs[static_cast<std::size_t>(rank)];
    out.resize(stride * static_cast<std::size_t>(calls));
    GPU_CHECK(cudaStreamSynchronize(stream.s));  // the calls first, then the pageable copy
    GPU_CHECK(cudaMemcpyAsync(out.data(), data.p, out.size() * sizeof(T), cudaMemcpyDeviceToHost, stream.s));
    GPU_CHECK(cudaStreamSynchronize(stream.s));
    ws.check();
    boot.barrier();  // no rank frees its buffers while a peer's kernel may still write into them
  });
  require_no_errors(errors);

  for (int c = 0; c < calls; ++c) {
    const auto& want = expected[static_cast<std::size_t>(c)];
    for (int r = 0; r < world; ++r) {
      const T* got = outputs[static_cast<std::size_t>(r)].data() + stride * static_cast<std::size_t>(c);
      std::size_t mismatches = 0, first = want.size();
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (fiar_test::bits(got[i]) != fiar_test::bits(want[i])) {
          if (mismatches++ == 0) first = i;
        }
      }
      const T* rank0 = outputs[0].data() + stride * static_cast<std::size_t>(c);
      const bool same_as_rank0 = std::memcmp(got, rank0, want.size() * sizeof(T)) == 0;
      CAPTURE(c, r, plan.tokens[static_cast<std::size_t>(c)],
              fiar::to_string(plan.strategies[static_cast<std::size_t>(c)]));
      if (mismatches != 0) {
        INFO("first mismatch at element " << first << ": got bits 0x" << std::hex << fiar_test::bits(got[first])
                                          << ", expected 0x" << fiar_test::bits(want[first]));
        CHECK(mismatches == 0);
      }
      CHECK(same_as_rank0);
    }
  }
}

// 40 vectors per token (threads 64, a partial warp) and 1536 (lanes loop over the token).
template <class T>
std::vector<int> hidden_dims() {
  const int per_vec = 16 / static_cast<int>(sizeof(T));
  return {40 * per_vec, 1536 * per_vec};
}

}  // namespace

TEMPLATE_TEST_CASE("several ranks on one GPU: one-shot and two-shot are bit-exact on every rank", "[gpu]", float,
                   __half, __nv_bfloat16) {
  const int world = GENERATE(2, 4, 8);
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const int hidden = GENERATE_COPY(from_range(hidden_dims<TestType>()));
  Plan plan;
  plan.devices.assign(static_cast<std::size_t>(world), 0);
  plan.hidden = hidden;
  plan.tokens = {1, 3, 17, 64, 2, 33, world};
  plan.strategies.assign(plan.tokens.size(), strategy);
  plan.label = std::string("one GPU, ") + std::string(fiar::to_string(strategy));
  run_and_check<TestType>(plan);
}

TEST_CASE("strategies mixed call by call, and Auto, keep the rotation consistent", "[gpu]") {
  Plan plan;
  plan.devices.assign(4, 0);
  plan.hidden = 1024;
  plan.tokens = {5, 5, 64, 1, 12, 7, 40, 2, 9};
  plan.strategies = {Strategy::OneShot, Strategy::TwoShot, Strategy::TwoShot, Strategy::OneShot, Strategy::Auto,
                     Strategy::TwoShot, Strategy::Auto,    Strategy::OneShot, Strategy::TwoShot};
  plan.label = "mixed strategies";
  run_and_check<__nv_bfloat16>(plan);
  run_and_check<float>(plan);
}

TEST_CASE("all visible GPUs as ranks of one process (and two ranks per GPU)", "[gpu][multi_gpu]") {
  const int n = std::min(device_count(), 8);
  if (n < 2) {
    WARN("only " << n << " GPU visible: the multi-GPU cases need 2 or more");
    return;
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0)) {
        WARN("GPU " << a << " cannot access GPU " << b << " (no peer-to-peer path): trtllm cannot run across them");
        return;
      }
    }
  }
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  Plan plan;
  for (int d = 0; d < n; ++d) plan.devices.push_back(d);
  plan.hidden = 4096;
  plan.tokens = {1, 7, 64, 3, 32};
  plan.strategies.assign(plan.tokens.size(), strategy);
  plan.label = "one rank per GPU";
  run_and_check<__nv_bfloat16>(plan);
  run_and_check<float>(plan);

  plan.devices = {0, 0, 1, 1};
  plan.label = "two ranks on each of two GPUs";
  run_and_check<__half>(plan);
}

TEST_CASE("a CUDA graph of all-reduces replays with the rotation advancing on the device", "[gpu]") {
  const int world = GENERATE(2, 4);
  constexpr int kHidden = 2048, kTokens = 16, kReplays = 5;
  const std::size_t count = static_cast<std::size_t>(kTokens) * kHidden;
  std::vector<std::vector<__nv_bfloat16>> in;
  for (int r = 0; r < world; ++r) in.push_back(fiar_test::make_input<__nv_bfloat16>(count, r, 0));
  const auto want = fiar_test::rank_order_sum(in, count);
  std::vector<int> wrong(static_cast<std::size_t>(world), 0);
  const auto errors =
      run_ranks_on(std::vector<int>(static_cast<std::size_t>(world), 0), [&](int rank, fiar::InProcessBootstrap& boot) {
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = kTokens;
        cfg.hidden_dim = kHidden;
        cfg.oneshot_at_max_tokens = true;
        cfg.timeout = 20s;
        Stream stream;
        DeviceBuffer<__nv_bfloat16> d_in(count), d_out(3 * count);
        std::vector<__nv_bfloat16> out(3 * count);
        GPU_CHECK(cudaMemcpy(d_in.p, in[static_cast<std::size_t>(rank)].data(), count * sizeof(__nv_bfloat16),
                             cudaMemcpyHostToDevice));
        GpuWorkspace<__nv_bfloat16> ws(boot, fiar::discover_topology(boot), cfg);
        // Thread-local capture: the other ranks (threads) keep calling the runtime meanwhile.
        cudaGraph_t graph = nullptr;
        GPU_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
        ws.allreduce(d_in.p, d_out.p, kTokens, stream.s, Strategy::OneShot);
        ws.allreduce(d_in.p, d_out.p + count, kTokens, stream.s, Strategy::TwoShot);
        ws.allreduce(d_in.p, d_out.p + 2 * count, kTokens, stream.s, Strategy::OneShot);
        GPU_CHECK(cudaStreamEndCapture(stream.s, &graph));
        cudaGraphExec_t exec = nullptr;
        GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        boot.barrier();  // every rank has instantiated before any replay waits for its peers
        for (int i = 0; i < kReplays; ++i) {
          GPU_CHECK(cudaMemsetAsync(d_out.p, 0xff, 3 * count * sizeof(__nv_bfloat16), stream.s));
          GPU_CHECK(cudaGraphLaunch(exec, stream.s));
          GPU_CHECK(cudaStreamSynchronize(stream.s));  // the replay first, then the pageable copy
          GPU_CHECK(cudaMemcpyAsync(out.data(), d_out.p, out.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost,
                                    stream.s));
          GPU_CHECK(cudaStreamSynchronize(stream.s));
          for (std::size_t k = 0; k < out.size(); ++k) {
            if (fiar_test::bits(out[k]) != fiar_test::bits(want[k % count])) ++wrong[static_cast<std::size_t>(rank)];
          }
        }
        ws.check();
        (void)cudaGraphExecDestroy(exec);
        (void)cudaGraphDestroy(graph);
        boot.barrier();
      });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(world, r);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("a rank that never calls: its peers get fiar::timeout_error from check(), promptly", "[gpu]") {
  const int world = GENERATE(2, 4);
  constexpr int kHidden = 256, kTokens = 8;
  std::vector<std::string> caught(static_cast<std::size_t>(world));
  std::vector<double> waited_ms(static_cast<std::size_t>(world), 0.0);
  const auto errors =
      run_ranks_on(std::vector<int>(static_cast<std::size_t>(world), 0), [&](int rank, fiar::InProcessBootstrap& boot) {
        fiar::WorkspaceConfig cfg;
        cfg.max_token_num = kTokens;
        cfg.hidden_dim = kHidden;
        cfg.timeout = 200ms;
        Stream stream;
        DeviceBuffer<float> data(static_cast<std::size_t>(kTokens) * kHidden);
        GPU_CHECK(cudaMemset(data.p, 0, static_cast<std::size_t>(kTokens) * kHidden * sizeof(float)));
        GpuWorkspace<float> ws(boot, fiar::discover_topology(boot), cfg);
        if (rank != world - 1) {  // the last rank never calls
          const auto start = std::chrono::steady_clock::now();
          ws.allreduce(data.p, data.p, kTokens, stream.s);
          GPU_CHECK(cudaStreamSynchronize(stream.s));
          waited_ms[static_cast<std::size_t>(rank)] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          try {
            ws.check();
          } catch (const fiar::timeout_error& e) {
            caught[static_cast<std::size_t>(rank)] = e.what();
          }
          // Every later call fails at once, before launching anything.
          try {
            ws.allreduce(data.p, data.p, kTokens, stream.s);
            caught[static_cast<std::size_t>(rank)] += " | the next call did not throw";
          } catch (const fiar::timeout_error&) {
          }
        }
        boot.barrier();  // the silent rank keeps its buffers until its peers' kernels have given up
      });
  require_no_errors(errors);
  // Every rank that polled the silent rank's data names it among the ranks whose data never arrived.
  for (int r = 0; r + 1 < world; ++r) {
    const std::string& what = caught[static_cast<std::size_t>(r)];
    CAPTURE(world, r, what);
    const std::string key = "gave up after 200 ms waiting for data from rank(s) ";
    const auto at = what.find(key);
    REQUIRE(at != std::string::npos);
    const std::string named = what.substr(at + key.size(), what.find(" (call", at) - at - key.size());
    CHECK(named.find(std::to_string(world - 1)) != std::string::npos);
    CHECK(what.find("did not throw") == std::string::npos);
    CHECK(waited_ms[static_cast<std::size_t>(r)] < 5000.0);
  }
}

TEST_CASE("data pointers must be device memory of the rank's GPU", "[gpu]") {
  const auto errors = run_ranks_on({0}, [&](int, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = 4;
    cfg.hidden_dim = 64;
    GpuWorkspace<float> ws(boot, fiar::discover_topology(boot), cfg);
    alignas(16) static float host[4 * 64];
    DeviceBuffer<float> dev(4 * 64);
    std::string what;
    try {
      ws.allreduce(host, dev.p, 4);
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    if (what.find("in = ") == std::string::npos || what.find("host memory") == std::string::npos ||
        what.find("device 0") == std::string::npos) {
      throw std::runtime_error("unexpected message for a host pointer: '" + what + "'");
    }
    // World size 1 copies the input.
    std::vector<float> h(4 * 64), back(4 * 64);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i) - 100.0f;
    GPU_CHECK(cudaMemcpy(dev.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    ws.allreduce(dev.p, dev.p, 4);
    GPU_CHECK(cudaMemcpy(back.data(), dev.p, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
    ws.check();
    if (std::memcmp(h.data(), back.data(), h.size() * sizeof(float)) != 0) {
      throw std::runtime_error("world size 1 did not copy its input");
    }
  });
  require_no_errors(errors);
}
