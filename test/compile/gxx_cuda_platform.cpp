// SPDX-License-Identifier: Apache-2.0
// A g++ translation unit that uses Workspace<TrtllmPolicy, T, CudaPlatform> through <fiar/fiar.hpp> only: it
// links because instantiate_all.cu (nvcc, <fiar/fiar.cuh>) instantiates the kernels and CudaPlatform::launch.
// Without a GPU, creation must fail on every rank with fiar::cuda_error; with one, a world-size-1 all-reduce
// must copy its input.
#include <fiar/fiar.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int gxx_cuda_platform_check() {
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  fiar::InProcessGroup group(1);
  auto boot = group.bootstrap(0);
  fiar::Topology topo;
  topo.arch = 90;  // world size 1, rank 0, one node: the defaults
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = 4;
  cfg.hidden_dim = 64;
  try {
    fiar::Workspace<fiar::TrtllmPolicy, float, fiar::CudaPlatform> ws(boot, topo, cfg);
    if (!gpu) {
      std::printf("gxx-cuda-platform: creation succeeded without a GPU\n");
      return 1;
    }
    std::vector<float> host(4 * 64), back(4 * 64, -1.0f);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 7.0f;
    float* d = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(float)) != cudaSuccess) return 1;
    cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    ws.allreduce(d, d, 4, nullptr);
    cudaMemcpy(back.data(), d, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(d);
    ws.check();
    if (std::memcmp(host.data(), back.data(), host.size() * sizeof(float)) != 0) {
      std::printf("gxx-cuda-platform: world size 1 did not copy its input\n");
      return 1;
    }
    return 0;
  } catch (const fiar::cuda_error& e) {
    if (gpu) std::printf("gxx-cuda-platform: %s\n", e.what());
    return gpu ? 1 : 0;
  }
}
