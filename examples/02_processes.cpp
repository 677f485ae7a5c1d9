// SPDX-License-Identifier: Apache-2.0
// Example 2 — one process per GPU, as inference engines run: started by mpirun, torchrun, a scheduler, or by hand.
//
//   mpirun -np 4 build/examples/02_processes
//   for r in 0 1 2 3; do FIAR_RANK=$r FIAR_WORLD_SIZE=4 build/examples/02_processes & done; wait
//
// The processes meet over fiar's TCP bootstrap (rank, world size and rendezvous from the launcher's variables:
// FIAR_RANK / FIAR_WORLD_SIZE / FIAR_MASTER_ADDR / FIAR_MASTER_PORT, torchrun's RANK / WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT (+ 1), or Open MPI's OMPI_COMM_WORLD_*; default rendezvous 127.0.0.1:29600). Each process uses the GPU of
// its local rank; without GPUs the ranks run on the host emulator, sharing memory across the processes. Every rank
// runs a fused residual add + RMSNorm and checks the residual output against the exact sum. Public API only.
#include <fiar/fiar.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kTokens = 2;
constexpr int kHidden = 2048;
constexpr std::size_t kCount = static_cast<std::size_t>(kTokens) * kHidden;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Small integers: the all-reduce and the residual add are exact in bf16, so every rank can check them exactly.
float input(int rank, std::size_t i) { return static_cast<float>((rank % 3) - 1) * static_cast<float>(i % 9); }
float residual(std::size_t i) { return static_cast<float>(static_cast<int>(i % 5) - 2); }

// Device buffers for one call (or host buffers on the emulator).
template <class Platform>
struct Buffer {
  __nv_bfloat16* p = nullptr;
  explicit Buffer(const std::vector<__nv_bfloat16>& host) {
    if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
      cuda_ok(cudaMalloc(&p, host.size() * sizeof(__nv_bfloat16)), "cudaMalloc");
      cuda_ok(cudaMemcpy(p, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
    } else {
      p = new __nv_bfloat16[host.size()];
      std::copy(host.begin(), host.end(), p);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
      (void)cudaFree(p);
    } else {
      delete[] p;
    }
  }
  std::vector<__nv_bfloat16> read(std::size_t n) const {
    std::vector<__nv_bfloat16> host(n);
    if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
      cuda_ok(cudaMemcpy(host.data(), p, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "cudaMemcpy");
    } else {
      std::copy(p, p + n, host.begin());
    }
    return host;
  }
};

template <class Platform>
long run(fiar::TcpBootstrap& boot, int local_rank) {
  fiar::Topology topo;
  if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
    int gpus = 0;
    cuda_ok(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
    cuda_ok(cudaSetDevice(local_rank % gpus), "cudaSetDevice");
    topo = fiar::discover_topology(boot);  // collective over the processes: nodes, multicast, peer access, arch
  } else {
    topo.world_size = boot.size();
    topo.rank = boot.rank();
    topo.arch = 90;
  }
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kTokens;
  cfg.hidden_dim = kHidden;
  auto ws = fiar::make_workspace<__nv_bfloat16, Platform>(boot, topo, cfg);

  std::vector<__nv_bfloat16> x(kCount), res(kCount), gamma(kHidden, __float2bfloat16(1.0f));
  for (std::size_t i = 0; i < kCount; ++i) {
    x[i] = __float2bfloat16(input(boot.rank(), i));
    res[i] = __float2bfloat16(residual(i));
  }
  Buffer<Platform> d_x(x), d_res(res), d_gamma(gamma), d_res_out(res), d_norm(res);
  fiar::FusedArgs<__nv_bfloat16> a;
  a.in = d_x.p;
  a.num_tokens = kTokens;
  a.residual_in = d_res.p;
  a.residual_out = d_res_out.p;  // x summed over the ranks, plus the residual
  a.gamma = d_gamma.p;
  a.norm_out = d_norm.p;  // RMSNorm of residual_out
  a.eps = 1e-6f;
  ws.template run<fiar::Pattern::ResidualRmsNorm>(a);
  if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ws.check();

  const auto out = d_res_out.read(kCount);
  const auto norm = d_norm.read(kCount);
  long wrong = 0;
  for (int t = 0; t < kTokens; ++t) {
    double squares = 0;
    for (int h = 0; h < kHidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * kHidden + h;
      float exact = residual(i);
      for (int r = 0; r < boot.size(); ++r) exact += input(r, i);
      if (__bfloat162float(out[i]) != exact) ++wrong;
      squares += static_cast<double>(exact) * exact;
    }
    const double inv_rms = 1.0 / std::sqrt(squares / kHidden + 1e-6);
    for (int h = 0; h < kHidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * kHidden + h;
      const double want = __bfloat162float(out[i]) * inv_rms;
      if (std::fabs(__bfloat162float(norm[i]) - want) > std::fabs(want) / 128 + 1e-6) ++wrong;  // bf16: 8 bits
    }
  }
  return wrong;
}

}  // namespace

int main() {
  try {
    // FIAR_* / torchrun / Open MPI variables; every wait (the rendezvous included) ends after 60 s at most.
    fiar::TcpBootstrap boot(fiar::TcpBootstrapOptions::from_environment(std::chrono::seconds(60)));
    const fiar::LaunchEnvironment env = fiar::launch_environment();
    const int local_rank = env.local_rank >= 0 ? env.local_rank : boot.rank();
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
    (void)cudaGetLastError();
    const long wrong = gpus > 0 ? run<fiar::CudaPlatform>(boot, local_rank) : run<fiar::HostPlatform>(boot, local_rank);
    std::printf("02_processes: rank %d of %d (%s, launched via %s): %s\n", boot.rank(), boot.size(),
                gpus > 0 ? "GPU" : "host emulator", env.source.c_str(), wrong == 0 ? "PASS" : "FAIL");
    return wrong == 0 ? 0 : 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "02_processes: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "02_processes: %s\n", e.what());
    return 1;
  }
}
