// SPDX-License-Identifier: Apache-2.0
// The trtllm backend on real GPUs: ranks are threads of this process, each with its own non-blocking stream.
// Every result is compared bit for bit with the host rank-order reference (fp32 sum in rank order from +0,
// rounded with the CUDA conversions, -0 reported as +0), and every rank must hold the same bits.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Strategy;

namespace {

using fiar_test::DeviceBuffer;
using fiar_test::on_ranks;
using fiar_test::Stream;

template <class T>
using GpuWorkspace = fiar_test::GpuWorkspace<fiar::TrtllmPolicy, T>;

// fiar_test::CallPlan with what the test calls it.
struct Plan : fiar_test::CallPlan {
  std::string label;
};

template <class T>
void run_and_check(const Plan& plan) {
  INFO(plan.label << ": world " << plan.devices.size() << ", " << fiar_test::dtype_label<T>() << ", hidden "
                  << plan.hidden);
  fiar_test::run_and_check_calls<fiar::TrtllmPolicy, T>(plan);
}

using fiar_test::hidden_dims;

}  // namespace

TEMPLATE_TEST_CASE("several ranks on one GPU: one-shot and two-shot are bit-exact on every rank", "[gpu]", float,
                   __half, __nv_bfloat16) {
  const int world = GENERATE(2, 4, 8);
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const int hidden = GENERATE_COPY(from_range(hidden_dims<TestType>()));
  Plan plan;
  plan.devices = fiar_test::ranks_on_gpu(world);
  plan.hidden = hidden;
  plan.tokens = {1, 3, 17, 64, 2, 33, world};
  plan.strategies.assign(plan.tokens.size(), strategy);
  plan.label = std::string("one GPU, ") + std::string(fiar::to_string(strategy));
  run_and_check<TestType>(plan);
}

TEST_CASE("strategies mixed call by call, and Auto, keep the rotation consistent", "[gpu]") {
  Plan plan;
  plan.devices = fiar_test::ranks_on_gpu(4);
  plan.hidden = 1024;
  plan.tokens = {5, 5, 64, 1, 12, 7, 40, 2, 9};
  plan.strategies = {Strategy::OneShot, Strategy::TwoShot, Strategy::TwoShot, Strategy::OneShot, Strategy::Auto,
                     Strategy::TwoShot, Strategy::Auto,    Strategy::OneShot, Strategy::TwoShot};
  plan.label = "mixed strategies";
  run_and_check<__nv_bfloat16>(plan);
  run_and_check<float>(plan);
}

TEST_CASE("all visible GPUs as ranks of one process (and two ranks per GPU)", "[gpu][multi_gpu]") {
  const std::vector<int> gpus = fiar_test::gpus_with_peer_access(8, "the multi-GPU cases need");
  if (gpus.empty()) return;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  Plan plan;
  plan.devices = gpus;
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
  // [rank]: elements wrong over every replay
  const auto wrong = on_ranks(fiar_test::ranks_on_gpu(world), [&](int rank, fiar::InProcessBootstrap& boot) {
    Stream stream;
    DeviceBuffer<__nv_bfloat16> d_in(count), d_out(3 * count);
    std::vector<__nv_bfloat16> out(3 * count);
    GPU_CHECK(cudaMemcpy(d_in.p, in[static_cast<std::size_t>(rank)].data(), count * sizeof(__nv_bfloat16),
                         cudaMemcpyHostToDevice));
    GpuWorkspace<__nv_bfloat16> ws(boot, fiar::discover_topology(boot), fiar_test::one_shot_config(kTokens, kHidden));
    const fiar_test::CapturedGraph graph(stream.s, [&] {
      ws.allreduce(d_in.p, d_out.p, kTokens, stream.s, Strategy::OneShot);
      ws.allreduce(d_in.p, d_out.p + count, kTokens, stream.s, Strategy::TwoShot);
      ws.allreduce(d_in.p, d_out.p + 2 * count, kTokens, stream.s, Strategy::OneShot);
    });
    boot.barrier();  // every rank has instantiated before any replay waits for its peers
    int bad = 0;
    for (int i = 0; i < kReplays; ++i) {
      GPU_CHECK(cudaMemsetAsync(d_out.p, 0xff, 3 * count * sizeof(__nv_bfloat16), stream.s));
      graph.launch(stream.s);
      GPU_CHECK(cudaStreamSynchronize(stream.s));  // the replay first, then the pageable copy
      fiar_test::download(out, d_out.p, out.size(), stream.s);
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      for (std::size_t k = 0; k < out.size(); ++k) {
        if (fiar_test::bits(out[k]) != fiar_test::bits(want[k % count])) ++bad;
      }
    }
    ws.check();
    boot.barrier();
    return bad;
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(world, r);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("a rank that never calls: its peers get fiar::timeout_error from check(), promptly", "[gpu]") {
  const int world = GENERATE(2, 4);
  constexpr int kHidden = 256, kTokens = 8;
  struct Seen {
    std::string caught;  ///< the timeout_error check() threw, and whether the next call did not throw
    double waited_ms = 0.0;
  };
  const auto seen = on_ranks(fiar_test::ranks_on_gpu(world), [&](int rank, fiar::InProcessBootstrap& boot) {
    Seen mine;
    Stream stream;
    DeviceBuffer<float> data(static_cast<std::size_t>(kTokens) * kHidden);
    GPU_CHECK(cudaMemset(data.p, 0, static_cast<std::size_t>(kTokens) * kHidden * sizeof(float)));
    GpuWorkspace<float> ws(boot, fiar::discover_topology(boot),
                           {.max_token_num = kTokens, .hidden_dim = kHidden, .timeout = 200ms});
    if (rank != world - 1) {  // the last rank never calls
      const auto start = std::chrono::steady_clock::now();
      ws.allreduce(data.p, data.p, kTokens, stream.s);
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      mine.waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      try {
        ws.check();
      } catch (const fiar::timeout_error& e) {
        mine.caught = e.what();
      }
      // Every later call fails at once, before launching anything.
      try {
        ws.allreduce(data.p, data.p, kTokens, stream.s);
        mine.caught += " | the next call did not throw";
      } catch (const fiar::timeout_error&) {
      }
    }
    boot.barrier();  // the silent rank keeps its buffers until its peers' kernels have given up
    return mine;
  });
  // Every rank that polled the silent rank's data names it among the ranks whose data never arrived.
  for (int r = 0; r + 1 < world; ++r) {
    const std::string& what = seen[static_cast<std::size_t>(r)].caught;
    CAPTURE(world, r, what);
    const std::string key = "gave up after 200 ms waiting for data from rank(s) ";
    const auto at = what.find(key);
    REQUIRE(at != std::string::npos);
    const std::string named = what.substr(at + key.size(), what.find(" (call", at) - at - key.size());
    CHECK(named.find(std::to_string(world - 1)) != std::string::npos);
    CHECK(what.find("did not throw") == std::string::npos);
    CHECK(seen[static_cast<std::size_t>(r)].waited_ms < 5000.0);
  }
}

TEST_CASE("data pointers must be device memory of the rank's GPU", "[gpu]") {
  on_ranks({0}, [&](int, fiar::InProcessBootstrap& boot) {
    GpuWorkspace<float> ws(boot, fiar::discover_topology(boot), {.max_token_num = 4, .hidden_dim = 64});
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
}
