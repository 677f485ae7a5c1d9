// SPDX-License-Identifier: Apache-2.0
// What the GPU tests share (test code only): their ranks as threads on GPUs with what each rank returned collected,
// the in-place call sequences checked bit for bit against the rank-order reference (trtllm, mnnvl), and one fused
// call on a rank with the tensors of the host tests (fusion, nccl, mnnvl). CUDA basics: gpu_device.hpp.
#pragma once

#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"
#include "gpu_device.hpp"

namespace fiar_test {

template <class Policy, class T>
using GpuWorkspace = fiar::Workspace<Policy, T, fiar::CudaPlatform>;

// The bootstrap bound of the GPU tests' ranks unless a test passes its own.
inline constexpr std::chrono::milliseconds kGpuBootstrapTimeout = std::chrono::seconds(60);

// fiar_test::run_ranks (common/host_harness.hpp) with devices[rank] current on each rank's thread. Named apart:
// run_ranks({0}, ...) would take {0} for a world size.
inline std::vector<std::string> run_ranks_on(const std::vector<int>& devices,
                                             const std::function<void(int, fiar::InProcessBootstrap&)>& body,
                                             std::chrono::milliseconds bootstrap_timeout = kGpuBootstrapTimeout) {
  return run_ranks(
      static_cast<int>(devices.size()),
      [&](int rank, fiar::InProcessBootstrap& boot) {
        GPU_CHECK(cudaSetDevice(devices[static_cast<std::size_t>(rank)]));
        body(rank, boot);
      },
      bootstrap_timeout);
}

// The GPU tests' rank skeleton: body(rank, bootstrap) on one thread per entry of `devices` (rank r on CUDA device
// devices[r]), then, on the test's thread, REQUIRE that no rank threw. Returns what each rank's body returned,
// [rank] (nothing when it returns void). The bodies only compute and throw (Catch2 is not thread-safe); the test
// checks what they returned.
template <class Body>
auto on_ranks(const std::vector<int>& devices, Body&& body,
              std::chrono::milliseconds bootstrap_timeout = kGpuBootstrapTimeout) {
  using Result = std::invoke_result_t<Body&, int, fiar::InProcessBootstrap&>;
  if constexpr (std::is_void_v<Result>) {
    require_no_errors(run_ranks_on(devices, body, bootstrap_timeout));
  } else {
    static_assert(!std::is_same_v<Result, bool>, "std::vector<bool> elements cannot be written by several threads");
    std::vector<Result> results(devices.size());
    require_no_errors(run_ranks_on(
        devices,
        [&](int rank, fiar::InProcessBootstrap& boot) { results[static_cast<std::size_t>(rank)] = body(rank, boot); },
        bootstrap_timeout));
    return results;
  }
}

// Runs body(), then meets the peers at boot.barrier() whether it threw or not (no rank frees memory while a peer's
// kernel may still write into it; peers waiting for a failed rank time out and arrive too), then rethrows.
template <class Boot, class Body>
void finish_together(Boot& boot, Body&& body) {
  std::exception_ptr failure;
  try {
    body();
  } catch (...) {
    failure = std::current_exception();
  }
  boot.barrier();
  if (failure) std::rethrow_exception(failure);
}

// A workspace sized so that one-shot can run at `max_tokens`, with kernel waits bounded by `timeout`.
inline fiar::WorkspaceConfig one_shot_config(int max_tokens, int hidden,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return {.max_token_num = max_tokens, .hidden_dim = hidden, .timeout = timeout, .oneshot_at_max_tokens = true};
}

// `world` ranks all on one GPU.
inline std::vector<int> ranks_on_gpu(int world, int device = 0) {
  return std::vector<int>(static_cast<std::size_t>(world), device);
}

// `world` ranks, rank r on GPU r.
inline std::vector<int> one_rank_per_gpu(int world) {
  std::vector<int> devices;
  for (int d = 0; d < world; ++d) devices.push_back(d);
  return devices;
}

// Devices 0 .. n-1, n the visible GPUs up to max_ranks, when there are 2 or more and each can access every other's
// memory; else a warning and no devices. `need` completes "only n GPU visible: <need> 2 or more".
inline std::vector<int> gpus_with_peer_access(int max_ranks, const char* need) {
  const int n = std::min(device_count(), max_ranks);
  if (n < 2) {
    WARN("only " << n << " GPU visible: " << need << " 2 or more");
    return {};
  }
  if (const std::string why = missing_peer_access(n); !why.empty()) {
    WARN(why);
    return {};
  }
  return one_rank_per_gpu(n);
}

// ---- in-place call sequences, bit for bit ----

// A sequence of all-reduces every rank makes in place, launched back to back on the rank's stream with nothing in
// between (so a fast rank runs a call ahead of a slow one and the buffer rotation is exercised), then synchronized
// once.
struct CallPlan {
  std::vector<int> devices;  ///< rank -> CUDA device
  int hidden = 0;
  std::vector<int> tokens;                 ///< per call
  std::vector<fiar::Strategy> strategies;  ///< per call
};

// Runs the plan on workspaces of Policy (sized for its largest call, one-shot possible there, 20 s kernel timeout)
// and checks every rank's every result bit for bit against the rank-order reference, and against rank 0's.
template <class Policy, class T>
void run_and_check_calls(const CallPlan& plan, std::chrono::milliseconds bootstrap_timeout = kGpuBootstrapTimeout) {
  const int world = static_cast<int>(plan.devices.size());
  const std::size_t calls = plan.tokens.size();
  int max_tokens = 1;
  for (int t : plan.tokens) max_tokens = std::max(max_tokens, t);
  const std::size_t stride = static_cast<std::size_t>(max_tokens) * plan.hidden;

  std::vector<std::vector<std::vector<T>>> inputs(calls);  // [call][rank]
  std::vector<std::vector<T>> expected(calls);             // [call]
  for (std::size_t c = 0; c < calls; ++c) {
    const std::size_t count = static_cast<std::size_t>(plan.tokens[c]) * plan.hidden;
    for (int r = 0; r < world; ++r) inputs[c].push_back(make_input<T>(count, r, static_cast<int>(c)));
    expected[c] = rank_order_sum(inputs[c], count);
  }

  // [rank]: every call's result, back to back
  const auto outputs = on_ranks(
      plan.devices,
      [&](int rank, fiar::InProcessBootstrap& boot) {
        // Allocate before the workspace: its creation ends with a barrier, so no rank launches a kernel that
        // waits for a peer while that peer is still inside an allocation call.
        Stream stream;
        DeviceBuffer<T> data(stride * calls);
        // The inputs on the rank's own stream, finished before any call (a cudaMemcpy from pageable memory may
        // return before its data lands, and the legacy stream does not order the non-blocking one).
        for (std::size_t c = 0; c < calls; ++c)
          upload(data.p + stride * c, inputs[c][static_cast<std::size_t>(rank)], stream.s);
        GPU_CHECK(cudaStreamSynchronize(stream.s));
        GpuWorkspace<Policy, T> ws(boot, fiar::discover_topology(boot), one_shot_config(max_tokens, plan.hidden));
        std::vector<T> out(stride * calls);
        finish_together(boot, [&] {
          for (std::size_t c = 0; c < calls; ++c) {
            T* region = data.p + stride * c;
            ws.allreduce(region, region, plan.tokens[c], stream.s, plan.strategies[c]);
          }
          GPU_CHECK(cudaStreamSynchronize(stream.s));  // the calls first, then the pageable copy
          download(out, data.p, out.size(), stream.s);
          GPU_CHECK(cudaStreamSynchronize(stream.s));
          ws.check();
        });
        return out;
      },
      bootstrap_timeout);

  for (std::size_t c = 0; c < calls; ++c) {
    const auto& want = expected[c];
    for (int r = 0; r < world; ++r) {
      const T* got = outputs[static_cast<std::size_t>(r)].data() + stride * c;
      std::size_t mismatches = 0, first = want.size();
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (bits(got[i]) != bits(want[i]) && mismatches++ == 0) first = i;
      }
      const T* rank0 = outputs[0].data() + stride * c;
      const bool same_as_rank0 = std::memcmp(got, rank0, want.size() * sizeof(T)) == 0;
      CAPTURE(c, r, plan.tokens[c], fiar::to_string(plan.strategies[c]));
      if (mismatches != 0) {
        INFO("first mismatch at element " << first << ": got bits 0x" << std::hex << bits(got[first]) << ", expected 0x"
                                          << bits(want[first]));
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

// ---- one fused call on a rank, with the host tests' tensors (common/fusion_reference.hpp) ----

inline constexpr float kFusedEps = 1e-5f;  // what check_pattern assumes

// One rank's device tensors for fused calls of up to `max_tokens` x `hidden` (allocate them before the workspace:
// its creation ends with a barrier, so no rank is inside cudaMalloc / cudaFree, which may wait for the whole device,
// while a peer's kernel waits for it).
template <class T>
struct FusedBuffers {
  DeviceBuffer<T> in, residual, out, residual_out, norm_out, gamma, gamma_pre;
  DeviceBuffer<std::uint8_t> quant, block_scales;
  DeviceBuffer<float> scale, scale_out;
  // The MoE finalize's inputs (moe_inputs: up to kMoeTopK experts per token).
  static constexpr int kMoeTopK = 10;
  DeviceBuffer<T> moe_in, moe_shared;
  DeviceBuffer<int> moe_idx;
  DeviceBuffer<float> moe_scale;
  FusedBuffers(int max_tokens, int hidden, std::size_t block_scale_bytes)
      : in(count(max_tokens, hidden)),
        residual(count(max_tokens, hidden)),
        out(count(max_tokens, hidden)),
        residual_out(count(max_tokens, hidden)),
        norm_out(count(max_tokens, hidden)),
        gamma(static_cast<std::size_t>(hidden)),
        gamma_pre(static_cast<std::size_t>(hidden)),
        quant(count(max_tokens, hidden)),
        block_scales(block_scale_bytes),
        scale(1),
        scale_out(static_cast<std::size_t>(max_tokens)),
        moe_in(count(max_tokens * kMoeTopK + 3, hidden)),
        moe_shared(count(max_tokens, hidden)),
        moe_idx(static_cast<std::size_t>(max_tokens) * kMoeTopK),
        moe_scale(static_cast<std::size_t>(max_tokens) * kMoeTopK) {}

  // gamma_of(hidden), gamma_pre_of(hidden) and the device scalar `scale` (the static FP8 scale, the NVFP4 global
  // scale), ready on return.
  void set_constants(int hidden, float scale_value, cudaStream_t stream) {
    const std::vector<T> g = gamma_of<T>(hidden), gp = gamma_pre_of<T>(hidden);
    upload(gamma.p, g, stream);
    upload(gamma_pre.p, gp, stream);
    GPU_CHECK(cudaMemcpyAsync(scale.p, &scale_value, sizeof(float), cudaMemcpyHostToDevice, stream));
    GPU_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  static std::size_t count(int tokens, int hidden) {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden);
  }
};

// One fused call's parameters.
struct FusedCall {
  int tokens = 0;
  fiar::Strategy strategy = fiar::Strategy::Auto;
  QuantOptions quant = {};  ///< NVFP4's scale layout, the FP8 groups' size and format
  bool in_place = false;    ///< out == in; norm_out == in, residual_out == residual_in
  float weight_bias = 0.0f;
};

// What one rank got from one fused call.
template <class T>
struct FusedResult {
  Outputs<T> outputs;                         ///< what the pattern writes; nothing when rejected
  std::string rejection;                      ///< what run<> threw as std::invalid_argument; "" when it ran
  fiar::Strategy ran = fiar::Strategy::Auto;  ///< last_strategy() after the call
};

// Runs pattern P once on this rank, on `stream`: the host tests' input of `rank` (make_input, residual_of; gamma and
// scale from set_constants) in device memory, every output first filled with a pattern the kernel must overwrite
// (0xff: NaN in every type). A std::invalid_argument from run<> (alike on every rank: nothing was launched) is
// returned, not thrown; the caller decides whether it was expected.
template <fiar::Pattern P, class Workspace, class T>
FusedResult<T> run_fused(Workspace& ws, FusedBuffers<T>& b, cudaStream_t stream, int rank, int hidden,
                         const FusedCall& c) {
  using fiar::Pattern;
  const std::size_t count = static_cast<std::size_t>(c.tokens) * static_cast<std::size_t>(hidden);
  constexpr bool fp8 = P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic;
  constexpr bool nvfp4 = P == Pattern::ResidualRmsNormNvfp4;
  constexpr bool group = P == Pattern::ResidualRmsNormFp8Group;
  constexpr bool mxfp8 = P == Pattern::ResidualRmsNormMxfp8;
  const int group_size = group_size_for<T>(c.quant, hidden);
  const std::size_t quant_bytes = nvfp4 ? count / 2 : count;
  const std::size_t scale_bytes =
      nvfp4   ? fiar::algo::nvfp4_scale_bytes(c.tokens, hidden, c.quant.layout)
      : group ? fiar::algo::fp8_group_scale_bytes(c.tokens, hidden, group_size, c.quant.group_scale)
      : mxfp8 ? fiar::algo::mxfp8_scale_bytes(c.tokens, hidden, c.quant.layout)
              : 0;
  // Host sources stay alive until the stream is synchronized below.
  const std::vector<T> in = make_input<T>(count, rank, 0, false);
  const std::vector<T> residual = residual_of<T>(count, 0);
  const std::vector<float> unset_scales(static_cast<std::size_t>(c.tokens), -1.0f);
  upload(b.in.p, in, stream);
  upload(b.residual.p, residual, stream);
  GPU_CHECK(cudaMemsetAsync(b.out.p, 0xff, count * sizeof(T), stream));
  GPU_CHECK(cudaMemsetAsync(b.residual_out.p, 0xff, count * sizeof(T), stream));
  GPU_CHECK(cudaMemsetAsync(b.norm_out.p, 0xff, count * sizeof(T), stream));
  GPU_CHECK(cudaMemsetAsync(b.quant.p, 0xAA, quant_bytes, stream));
  if (scale_bytes != 0) GPU_CHECK(cudaMemsetAsync(b.block_scales.p, 0xAA, scale_bytes, stream));
  upload(b.scale_out.p, unset_scales, stream);

  fiar::FusedArgs<T> a;
  a.in = b.in.p;
  a.num_tokens = c.tokens;
  constexpr bool moe = fiar::pattern_traits(P).prologue == fiar::Prologue::MoeFinalize;
  const MoeInputs<T> m = moe ? moe_inputs<T>(c.tokens, hidden, rank, c.quant) : MoeInputs<T>{};
  if constexpr (moe) {  // (in place means residual_out == residual_in only: nothing may be written over in)
    upload(b.moe_in.p, m.in, stream);
    upload(b.moe_idx.p, m.idx, stream);
    upload(b.moe_scale.p, m.scale, stream);
    if (c.quant.shared) upload(b.moe_shared.p, m.shared, stream);
    a.in = b.moe_in.p;
    a.expanded_idx_to_permuted_idx = b.moe_idx.p;
    a.expert_scale = b.moe_scale.p;
    a.shared_expert_out = c.quant.shared ? b.moe_shared.p : nullptr;
    a.top_k = c.quant.top_k;
    a.num_permuted_rows = m.rows;
    a.routed_scaling_factor = c.quant.routed_scaling_factor;
  }
  if constexpr (!fiar::pattern_traits(P).norm) {
    a.out = c.in_place && !moe ? b.in.p : b.out.p;
  } else {
    if constexpr (uses<P>(fiar::FusedTensor::ResidualIn)) {
      a.residual_in = b.residual.p;
      a.residual_out = c.in_place ? b.residual.p : b.residual_out.p;
    }
    a.gamma = b.gamma.p;
    if constexpr (uses<P>(fiar::FusedTensor::GammaPre)) a.gamma_pre = b.gamma_pre.p;
    a.eps = kFusedEps;
    a.weight_bias = c.weight_bias;
    a.norm_out = c.in_place && !moe ? b.in.p : b.norm_out.p;
  }
  if constexpr (fp8 || nvfp4 || group || mxfp8) a.quant_out = b.quant.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8 || nvfp4) a.scale = b.scale.p;
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) a.scale_out = b.scale_out.p;
  if constexpr (nvfp4 || mxfp8) {
    a.block_scale_out = b.block_scales.p;
    a.layout = c.quant.layout;
  }
  if constexpr (group) {
    a.block_scale_out = b.block_scales.p;
    a.group_size = group_size;
    a.group_scale = c.quant.group_scale;
  }

  FusedResult<T> result;
  try {
    ws.template run<P>(a, stream, c.strategy);
  } catch (const std::invalid_argument& e) {
    result.rejection = e.what();
    GPU_CHECK(cudaStreamSynchronize(stream));  // the fills, before their host sources go
    return result;
  }
  result.ran = ws.last_strategy();
  // Wait for the kernel before copying back: a device-to-host copy into pageable memory blocks this thread
  // inside the runtime while its kernel waits for peers that share the GPU, and those peers' threads may
  // need the runtime to launch (docs/troubleshooting.md, "ranks sharing one GPU").
  GPU_CHECK(cudaStreamSynchronize(stream));

  Outputs<T>& o = result.outputs;
  if constexpr (!fiar::pattern_traits(P).norm) {
    download(o.out, c.in_place && !moe ? b.in.p : b.out.p, count, stream);
  } else {
    if constexpr (uses<P>(fiar::FusedTensor::ResidualOut))
      download(o.residual_out, c.in_place ? b.residual.p : b.residual_out.p, count, stream);
    download(o.norm_out, c.in_place && !moe ? b.in.p : b.norm_out.p, count, stream);
  }
  if constexpr (fp8 || nvfp4 || group || mxfp8) download(o.quant, b.quant.p, quant_bytes, stream);
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic)
    download(o.scale_out, b.scale_out.p, static_cast<std::size_t>(c.tokens), stream);
  if constexpr (nvfp4 || group || mxfp8) download(o.block_scales, b.block_scales.p, scale_bytes, stream);
  GPU_CHECK(cudaStreamSynchronize(stream));
  ws.check();
  return result;
}

}  // namespace fiar_test
