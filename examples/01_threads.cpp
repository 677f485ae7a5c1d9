// SPDX-License-Identifier: Apache-2.0
// Example 1 — one process drives every GPU of the node, one thread per GPU (or 4 emulated ranks without a GPU).
//
//   build/examples/01_threads            # every GPU here, or the host emulator when there is none
//
// Each thread: its own bootstrap handle, the topology discovered together (GPUs) or stated (emulator), a workspace
// whose backend the group agrees on, one bf16 all-reduce, and a check against the exact sum. Public API only.
#include <fiar/fiar.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kTokens = 4;
constexpr int kHidden = 1024;
constexpr std::size_t kCount = static_cast<std::size_t>(kTokens) * kHidden;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Rank r contributes (r + 1) x a small integer: every partial sum is an integer below 256, exact in bf16.
float input(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (static_cast<int>(i % 13) - 6)); }

// Runs one rank; returns how many elements differ from the exact sum.
template <class Platform>
long run_rank(fiar::InProcessBootstrap& boot, std::string& backend) {
  const int rank = boot.rank(), world = boot.size();
  fiar::Topology topo;
  if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
    cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
    topo = fiar::discover_topology(boot);  // collective: every thread calls it
  } else {
    topo.world_size = world;  // the emulator's machine: one node, no multicast, sm_90
    topo.rank = rank;
    topo.arch = 90;
  }
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kTokens;
  cfg.hidden_dim = kHidden;
  auto ws = fiar::make_workspace<__nv_bfloat16, Platform>(boot, topo, cfg);
  backend = fiar::to_string(ws.backend());

  std::vector<__nv_bfloat16> in(kCount), out(kCount);
  for (std::size_t i = 0; i < kCount; ++i) in[i] = __float2bfloat16(input(rank, i));
  if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
    cudaStream_t stream = nullptr;
    __nv_bfloat16 *d_in = nullptr, *d_out = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaMalloc(&d_in, kCount * sizeof(__nv_bfloat16)), "cudaMalloc");
    cuda_ok(cudaMalloc(&d_out, kCount * sizeof(__nv_bfloat16)), "cudaMalloc");
    cuda_ok(cudaMemcpy(d_in, in.data(), kCount * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
    ws.allreduce(d_in, d_out, kTokens, stream);
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    ws.check();  // a peer that never came would show here as fiar::timeout_error
    cuda_ok(cudaMemcpy(out.data(), d_out, kCount * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "cudaMemcpy");
    (void)cudaFree(d_in);
    (void)cudaFree(d_out);
    (void)cudaStreamDestroy(stream);
  } else {
    ws.allreduce(in.data(), out.data(), kTokens);  // the emulator's "device memory" is host memory
    ws.check();
  }

  long wrong = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    float exact = 0;
    for (int r = 0; r < world; ++r) exact += input(r, i);
    if (__bfloat162float(out[i]) != exact) ++wrong;
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
  std::vector<std::string> errors(static_cast<std::size_t>(world)), backend(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        auto boot = group.bootstrap(r);
        wrong[i] =
            gpus > 0 ? run_rank<fiar::CudaPlatform>(boot, backend[i]) : run_rank<fiar::HostPlatform>(boot, backend[i]);
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
    ok = ok && errors[i].empty() && wrong[i] == 0;
  }
  std::printf("01_threads: %s: %d rank(s) as threads on %s, backend %s, %d x %d bf16\n", ok ? "PASS" : "FAIL", world,
              gpus > 0 ? "GPUs" : "the host emulator", backend[0].c_str(), kTokens, kHidden);
  return ok ? 0 : 1;
}
