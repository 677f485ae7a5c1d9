// SPDX-License-Identifier: Apache-2.0
// Example 5 — an epilogue you write yourself: DeepSeek-V4's mHC post-mixing fused with the all-reduce of a
// tensor-parallel layer (examples/mhc_post_mix.hpp), where residual + RMSNorm is not what follows the all-reduce.
//
//   build/examples/05_user_epilogue      # one thread per GPU; without a GPU, 4 emulated ranks
//
// What it takes:
//   - the epilogue: a struct with a name, a Params template of your tensors and a finish() that gets each reduced
//     token (its vectors, the cluster-wide sum and max), in a header (mhc_post_mix.hpp);
//   - its kernels: FIAR_INSTANTIATE_EPILOGUE(MhcPostMix, __nv_bfloat16) in the module's nvcc translation unit
//     (examples/kernels.cu), next to #include <fiar/instantiate.cuh>;
//   - the call: ws.run<MhcPostMix>(in, num_tokens, params, stream, strategy), on any backend and strategy.
// Every strategy the workspace offers runs once, and each rank's 4 streams are checked against the formula computed
// here from the exact sum. Public API only.
#include <fiar/fiar.hpp>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "mhc_post_mix.hpp"

namespace {

constexpr int kTokens = 4;
constexpr int kHidden = 2048;
constexpr int kStreams = MhcPostMix::kStreams;
constexpr std::size_t kCount = static_cast<std::size_t>(kTokens) * kHidden;
using T = __nv_bfloat16;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// The layer's partial output on rank r (small integers: the sum is exact in bf16), the residual streams and the
// mixing coefficients (the same on every rank, as the model computes them there).
float partial(int rank, std::size_t i) { return static_cast<float>((static_cast<int>(i % 9) - 4) * (rank + 1)); }
float stream(std::size_t i) { return static_cast<float>(static_cast<int>(i % 7) - 3); }
float post_coefficient(std::size_t i) { return 0.5f + 0.25f * static_cast<float>(i % 3); }
float comb_coefficient(std::size_t i) { return 0.125f * static_cast<float>(static_cast<int>(i % 5) - 2); }

// out[t, j, h] by the formula: post x x, then fma over the 4 streams, rounded once to bf16.
float expected(int world, int t, int j, int h) {
  float x = 0.0f;
  for (int r = 0; r < world; ++r) x += partial(r, static_cast<std::size_t>(t) * kHidden + h);
  float acc = post_coefficient(static_cast<std::size_t>(t) * kStreams + j) * x;
  for (int i = 0; i < kStreams; ++i) {
    acc = std::fma(comb_coefficient((static_cast<std::size_t>(t) * kStreams + i) * kStreams + j),
                   stream((static_cast<std::size_t>(t) * kStreams + i) * kHidden + h), acc);
  }
  return __bfloat162float(__float2bfloat16(acc));
}

// Host copies of one rank's tensors.
struct Tensors {
  std::vector<T> in, residual, out;
  std::vector<float> post, comb;
  explicit Tensors(int rank)
      : in(kCount),
        residual(kCount * kStreams),
        out(kCount * kStreams),
        post(kTokens * kStreams),
        comb(kTokens * kStreams * kStreams) {
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = __float2bfloat16(partial(rank, i));
    for (std::size_t i = 0; i < residual.size(); ++i) residual[i] = __float2bfloat16(stream(i));
    for (std::size_t i = 0; i < post.size(); ++i) post[i] = post_coefficient(i);
    for (std::size_t i = 0; i < comb.size(); ++i) comb[i] = comb_coefficient(i);
  }
};

// A device copy of a host vector (freed by the caller's list).
template <class V>
auto* to_device(const std::vector<V>& host, std::vector<void*>& owned) {
  V* d = nullptr;
  cuda_ok(cudaMalloc(&d, host.size() * sizeof(V)), "cudaMalloc");
  cuda_ok(cudaMemcpy(d, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice), "cudaMemcpy");
  owned.push_back(d);
  return d;
}

// Runs one rank: every strategy of its workspace once; returns the elements that differ from the formula.
template <class Platform>
long run_rank(fiar::InProcessBootstrap& boot, std::string& backend, int& strategies) {
  const int rank = boot.rank(), world = boot.size();
  fiar::Topology topo;
  if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
    cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
    topo = fiar::discover_topology(boot);
  } else {
    topo = fiar::Topology{.world_size = world,
                          .rank = rank,
                          .node_count = 1,
                          .multicast_supported = true,
                          .arch = 90};  // one node with NVLink multicast: the mnnvl backend and its strategies
  }
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kTokens;
  cfg.hidden_dim = kHidden;
  cfg.oneshot_at_max_tokens = true;  // one-shot and two-shot both fit every call
  auto ws = fiar::make_workspace<T, Platform>(boot, topo, cfg);
  backend = fiar::to_string(ws.backend());

  Tensors host(rank);
  std::vector<fiar::Strategy> order{fiar::Strategy::Auto};
  for (fiar::Strategy s : {fiar::Strategy::OneShot, fiar::Strategy::TwoShot, fiar::Strategy::Multimem}) {
    if (ws.is_buffer_size_sufficient(kTokens, s)) order.push_back(s);
  }
  strategies = static_cast<int>(order.size());
  long wrong = 0;
  for (fiar::Strategy s : order) {
    std::vector<T> out(kCount * kStreams);
    if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
      std::vector<void*> owned;
      const MhcPostMix::Params<T> p{to_device(host.residual, owned), to_device(host.post, owned),
                                    to_device(host.comb, owned), to_device(host.out, owned)};
      const T* in = to_device(host.in, owned);
      ws.template run<MhcPostMix>(in, kTokens, p, nullptr, s);
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      ws.check();
      cuda_ok(cudaMemcpy(out.data(), p.out, out.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (void* d : owned) (void)cudaFree(d);
    } else {
      const MhcPostMix::Params<T> p{host.residual.data(), host.post.data(), host.comb.data(), out.data()};
      ws.template run<MhcPostMix>(host.in.data(), kTokens, p, nullptr,
                                  s);  // the emulator's "device memory" is host memory
      ws.check();
    }
    for (int t = 0; t < kTokens; ++t) {
      for (int j = 0; j < kStreams; ++j) {
        for (int h = 0; h < kHidden; ++h) {
          const float got = __bfloat162float(out[(static_cast<std::size_t>(t) * kStreams + j) * kHidden + h]);
          if (got != expected(world, t, j, h)) ++wrong;
        }
      }
    }
  }
  return wrong;
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  (void)cudaGetLastError();
  const int world = gpus > 0 ? gpus : 4;
  fiar::InProcessGroup group(world);
  std::vector<long> wrong(static_cast<std::size_t>(world), 0);
  std::vector<int> strategies(static_cast<std::size_t>(world), 0);
  std::vector<std::string> errors(static_cast<std::size_t>(world)), backend(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        auto boot = group.bootstrap(r);
        wrong[i] = gpus > 0 ? run_rank<fiar::CudaPlatform>(boot, backend[i], strategies[i])
                            : run_rank<fiar::HostPlatform>(boot, backend[i], strategies[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (!errors[i].empty()) std::fprintf(stderr, "rank %d: %s\n", r, errors[i].c_str());
    if (wrong[i] != 0) std::fprintf(stderr, "rank %d: %ld elements differ from the formula\n", r, wrong[i]);
    ok = ok && errors[i].empty() && wrong[i] == 0;
  }
  std::printf(
      "05_user_epilogue: %s: mHC post-mixing after the all-reduce, %d rank(s) on %s, backend %s, %d "
      "strategies, %d x %d bf16 into %d streams\n",
      ok ? "PASS" : "FAIL", world, gpus > 0 ? "GPUs" : "the host emulator", backend[0].c_str(), strategies[0], kTokens,
      kHidden, kStreams);
  return ok ? 0 : 1;
}
