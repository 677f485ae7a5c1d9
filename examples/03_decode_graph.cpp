// SPDX-License-Identifier: Apache-2.0
// Example 3 — a decode step captured once in a CUDA graph and replayed: the all-reduce of the attention output, the
// residual add, RMSNorm and FP8 quantization of the normed activations, in one fused call per step.
//
//   build/examples/03_decode_graph       # one thread per GPU; without a GPU, 2 emulated ranks (no graphs there)
//
// What a serving engine must get right, shown here:
//   - the workspace is created (and sized: max_token_num, hidden_dim) before capture; nothing is allocated after;
//   - the captured call fixes its pointers and num_tokens, so each step writes new inputs into the same buffers;
//   - the FP8 scale is read from device memory when the graph runs: update it in place, never recapture;
//   - check() after a replay reports a peer that never came (fiar::timeout_error) instead of a hang.
// Every step is checked: residual_out exactly, norm_out within bf16 rounding, the FP8 bytes against the quantization
// of norm_out. Public API only.
#include <fiar/fiar.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kBatch = 8;  // decode tokens per step
constexpr int kHidden = 4096;
constexpr int kSteps = 5;
constexpr std::size_t kCount = static_cast<std::size_t>(kBatch) * kHidden;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

float attention(int rank, int step, std::size_t i) {
  return static_cast<float>((static_cast<int>((i * 7 + step * 3 + rank) % 11) - 5) * (rank + 1));
}
float residual(int step, std::size_t i) { return static_cast<float>(static_cast<int>((i + step) % 7) - 3); }

// The tensors of one rank, in device memory on a GPU and in host memory on the emulator.
template <class Platform>
struct StepTensors {
  static constexpr bool kGpu = std::is_same_v<Platform, fiar::CudaPlatform>;
  std::vector<void*> owned;
  template <class T>
  T* make(std::size_t n) {
    void* p = nullptr;
    if constexpr (kGpu) {
      cuda_ok(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
      cuda_ok(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
    } else {
      p = ::operator new(n * sizeof(T));
      std::memset(p, 0, n * sizeof(T));
    }
    owned.push_back(p);
    return static_cast<T*>(p);
  }
  void put(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    if constexpr (kGpu) {
      cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  void get(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    if constexpr (kGpu) {
      cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
      cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  ~StepTensors() {
    for (void* p : owned) {
      if constexpr (kGpu) {
        (void)cudaFree(p);
      } else {
        ::operator delete(p);
      }
    }
  }
};

// Checks one step's outputs on one rank; returns the elements outside their bound.
long check_step(int world, int step, float scale, const std::vector<__nv_bfloat16>& res_out,
                const std::vector<__nv_bfloat16>& norm, const std::vector<std::uint8_t>& fp8) {
  long wrong = 0;
  for (int t = 0; t < kBatch; ++t) {
    double squares = 0;
    for (int h = 0; h < kHidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * kHidden + h;
      float exact = residual(step, i);
      for (int r = 0; r < world; ++r) exact += attention(r, step, i);
      if (__bfloat162float(res_out[i]) != exact) ++wrong;  // small integers: exact in bf16
      squares += static_cast<double>(exact) * exact;
    }
    const double inv_rms = 1.0 / std::sqrt(squares / kHidden + 1e-6);
    for (int h = 0; h < kHidden; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * kHidden + h;
      const double want = __bfloat162float(res_out[i]) * inv_rms;  // gamma = 1
      const float got = __bfloat162float(norm[i]);
      if (std::fabs(got - want) > std::fabs(want) / 128 + 1e-6) ++wrong;
      const auto q = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(got * (1.0f / scale), __NV_SATFINITE, __NV_E4M3));
      if (fp8[i] != q) ++wrong;
    }
  }
  return wrong;
}

template <class Platform>
long run_rank(fiar::InProcessBootstrap& boot) {
  constexpr bool kGpu = std::is_same_v<Platform, fiar::CudaPlatform>;
  const int rank = boot.rank(), world = boot.size();
  fiar::Topology topo;
  cudaStream_t stream = nullptr;
  if constexpr (kGpu) {
    cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    topo = fiar::discover_topology(boot);
  } else {
    topo.world_size = world;
    topo.rank = rank;
    topo.arch = 90;
  }
  // 1. Size the workspace for the largest step the graph will ever run, before any capture.
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kBatch;
  cfg.hidden_dim = kHidden;
  auto ws = fiar::make_workspace<__nv_bfloat16, Platform>(boot, topo, cfg);

  // 2. The step's tensors, allocated once; the graph holds their addresses.
  StepTensors<Platform> mem;
  fiar::FusedArgs<__nv_bfloat16> a;
  auto* in = mem.template make<__nv_bfloat16>(kCount);
  auto* res_in = mem.template make<__nv_bfloat16>(kCount);
  auto* gamma = mem.template make<__nv_bfloat16>(kHidden);
  auto* scale = mem.template make<float>(1);
  a.in = in;
  a.num_tokens = kBatch;
  a.residual_in = res_in;
  a.residual_out = mem.template make<__nv_bfloat16>(kCount);
  a.gamma = gamma;
  a.norm_out = mem.template make<__nv_bfloat16>(kCount);
  a.quant_out = mem.template make<std::uint8_t>(kCount);
  a.scale = scale;
  a.eps = 1e-6f;
  const std::vector<__nv_bfloat16> ones(kHidden, __float2bfloat16(1.0f));
  mem.put(gamma, ones.data(), kHidden * sizeof(__nv_bfloat16), stream);

  // 3. Capture the step once (GPUs). Thread-local capture mode: every rank's thread captures at the same time.
  cudaGraphExec_t exec = nullptr;
  if constexpr (kGpu) {
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    ws.template run<fiar::Pattern::ResidualRmsNormFp8>(a, stream);
    cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    (void)cudaGraphDestroy(graph);
  }

  // 4. Each step: new inputs into the same buffers, the scale updated in place, one replay, then the check.
  long wrong = 0;
  std::vector<__nv_bfloat16> x(kCount), r(kCount), res_out(kCount), norm(kCount);
  std::vector<std::uint8_t> fp8(kCount);
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t i = 0; i < kCount; ++i) {
      x[i] = __float2bfloat16(attention(rank, step, i));
      r[i] = __float2bfloat16(residual(step, i));
    }
    const float step_scale = 0.01f * static_cast<float>(step + 1);
    mem.put(in, x.data(), kCount * sizeof(__nv_bfloat16), stream);
    mem.put(res_in, r.data(), kCount * sizeof(__nv_bfloat16), stream);
    mem.put(scale, &step_scale, sizeof(float), stream);
    if constexpr (kGpu) {
      cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    } else {
      ws.template run<fiar::Pattern::ResidualRmsNormFp8>(a);  // the emulator has no graphs: the same call, eagerly
    }
    ws.check();
    mem.get(res_out.data(), a.residual_out, kCount * sizeof(__nv_bfloat16), stream);
    mem.get(norm.data(), a.norm_out, kCount * sizeof(__nv_bfloat16), stream);
    mem.get(fp8.data(), a.quant_out, kCount, stream);
    wrong += check_step(world, step, step_scale, res_out, norm, fp8);
  }
  if constexpr (kGpu) {
    (void)cudaGraphExecDestroy(exec);
    (void)cudaStreamDestroy(stream);
  }
  return wrong;
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  (void)cudaGetLastError();
  const int world = gpus > 0 ? gpus : 2;
  fiar::InProcessGroup group(world);
  std::vector<long> wrong(static_cast<std::size_t>(world), 0);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto boot = group.bootstrap(r);
        wrong[static_cast<std::size_t>(r)] =
            gpus > 0 ? run_rank<fiar::CudaPlatform>(boot) : run_rank<fiar::HostPlatform>(boot);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    if (!errors[static_cast<std::size_t>(r)].empty())
      std::fprintf(stderr, "rank %d: %s\n", r, errors[static_cast<std::size_t>(r)].c_str());
    ok = ok && errors[static_cast<std::size_t>(r)].empty() && wrong[static_cast<std::size_t>(r)] == 0;
  }
  std::printf("03_decode_graph: %s: %d rank(s), %d steps of %d tokens x %d (%s)\n", ok ? "PASS" : "FAIL", world, kSteps,
              kBatch, kHidden, gpus > 0 ? "one CUDA graph replayed per step" : "host emulator, no graphs");
  return ok ? 0 : 1;
}
