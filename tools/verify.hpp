// SPDX-License-Identifier: Apache-2.0
// What fiar-demo and fiar-bench share: where a rank's tensors live (host memory on the emulator, device memory and
// a stream on a GPU), the deterministic inputs, and the independent reference their results are checked against
// (fp64 sums within the documented bound; the fused patterns' outputs as docs/design.md defines them).
#pragma once

#include <fiar/fiar.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli.hpp"

namespace fiar_tools {

using fiar_cli::UsageError;

template <class... Choices>
std::string parse_choice(std::string_view flag, std::string_view text, Choices... choices) {
  for (std::string_view c : {std::string_view(choices)...}) {
    if (text == c) return std::string(text);
  }
  std::string list;
  for (std::string_view c : {std::string_view(choices)...}) list += (list.empty() ? "" : ", ") + std::string(c);
  throw UsageError(std::string(flag) + " " + fiar_cli::quoted(text) + ": expected one of " + list);
}

// Whether a CUDA device can be used here (count: how many); `why` says why not.
inline bool usable_gpu(int& count, std::string& why) {
  count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    why = e != cudaSuccess ? fiar_cli::describe_cuda(e) : "no CUDA device found";
    (void)cudaGetLastError();
    count = 0;
    return false;
  }
  return true;
}

/// Where a tool runs: the platform asked for, or cuda when a usable GPU exists and host otherwise; `platform` is
/// empty (and why is printed on stderr) when cuda was asked for without a usable GPU.
struct PlatformChoice {
  std::string platform;
  int gpus = 0;        ///< usable GPUs
  std::string no_gpu;  ///< why there is none
};
inline PlatformChoice choose_platform(std::string_view tool, const std::string& requested) {
  PlatformChoice c;
  const bool have_gpu = usable_gpu(c.gpus, c.no_gpu);
  c.platform = requested.empty() ? (have_gpu ? "cuda" : "host") : requested;
  if (c.platform == "cuda" && !have_gpu) {
    std::fprintf(stderr, "%.*s: --platform cuda needs a usable CUDA device: %s. Fix: use --platform host.\n",
                 static_cast<int>(tool.size()), tool.data(), c.no_gpu.c_str());
    c.platform.clear();
  }
  return c;
}

/// The pattern named `value` (every pattern of fiar's table, by its name).
inline fiar::Pattern parse_pattern(std::string_view flag, const std::string& value) {
  std::string list;
  for (int i = 0; fiar::is_valid(static_cast<fiar::Pattern>(i)); ++i) {
    const auto c = static_cast<fiar::Pattern>(i);
    if (value == fiar::to_string(c)) return c;
    list += (list.empty() ? "" : ", ") + std::string(fiar::to_string(c));
  }
  throw UsageError(std::string(flag) + " " + fiar_cli::quoted(value) + ": expected one of " + list);
}

/// The strategy named `value`: auto, oneshot, twoshot or multimem (mnnvl's in-switch reduction).
inline fiar::Strategy parse_strategy(std::string_view flag, std::string_view value) {
  const std::string s = parse_choice(flag, value, "auto", "oneshot", "twoshot", "multimem", "nccl");
  return s == "oneshot"    ? fiar::Strategy::OneShot
         : s == "twoshot"  ? fiar::Strategy::TwoShot
         : s == "multimem" ? fiar::Strategy::Multimem
         : s == "nccl"     ? fiar::Strategy::Nccl
                           : fiar::Strategy::Auto;
}

/// The topology the tools' flags describe (the host emulator's, and --plan's).
inline fiar::Topology flag_topology(int world, int nodes, bool multicast, int arch) {
  fiar::Topology topo;
  topo.world_size = world;
  topo.node_count = nodes;
  topo.multicast_supported = multicast;
  topo.fabric_handles_supported = multicast && nodes > 1;
  topo.arch = arch;
  return topo;
}

/// Makes rank `rank`'s GPU (rank % gpus) current on this thread, or throws naming it.
inline void use_rank_device(int rank, int gpus) {
  if (const cudaError_t e = cudaSetDevice(rank % gpus); e != cudaSuccess) {
    throw std::runtime_error("fiar tools: cudaSetDevice(" + std::to_string(rank % gpus) + ") on rank " +
                             std::to_string(rank) + ": " + fiar_cli::describe_cuda(e));
  }
}

/// Rank 0's view of the GPUs when `world` ranks (threads of this process) share `gpus` GPUs: every rank runs
/// discovery on its GPU, as a workspace's ranks would.
inline fiar::DiscoveryReport discover_on_gpus(int world, int gpus) {
  fiar::InProcessGroup probe(world);
  std::vector<fiar::DiscoveryReport> reports(static_cast<std::size_t>(world));
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        (void)cudaSetDevice(r % gpus);
        auto boot = probe.bootstrap(r);
        reports[static_cast<std::size_t>(r)] = fiar::discover_topology_report(boot);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) {
    if (!f.empty()) throw std::runtime_error("topology discovery failed: " + f);
  }
  return reports[0];
}

/// What the checks of one rank found: elements outside their bound, and the largest error seen.
struct Check {
  long mismatches = 0;
  double max_error = 0;
};

// ---- the independent reference: fp64 sums of the same inputs, and the documented error bound ----

// Input element i of rank r at iteration it: a deterministic mix of magnitudes and signs, zeros included.
inline float input_value(int r, int it, std::size_t i) {
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(r * 40503 + it * 9973);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  if (h % 97 == 0) return (h & 1) ? -0.0f : 0.0f;
  const float unit = static_cast<float>(h % 20001) / 10000.0f - 1.0f;  // [-1, 1]
  return unit * std::ldexp(1.0f, static_cast<int>((h >> 20) % 6) - 2);
}

template <class T>
inline double unit_roundoff() {
  return std::is_same_v<T, float>    ? std::ldexp(1.0, -24)
         : std::is_same_v<T, __half> ? std::ldexp(1.0, -11)
                                     : std::ldexp(1.0, -8);
}

// The spacing of T's subnormals (its smallest positive value): rounding a result near zero to T may be off by up to
// half of it whatever the relative bound says, so every bound below carries it as an absolute term.
template <class T>
inline double subnormal_step() {
  return std::is_same_v<T, float>    ? std::ldexp(1.0, -149)
         : std::is_same_v<T, __half> ? std::ldexp(1.0, -24)
                                     : std::ldexp(1.0, -133);
}

// Where a rank's tensors live: host memory on the emulator, device memory (one stream) on the GPU.
struct Memory {
  virtual ~Memory() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void download(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void sync() = 0;
  virtual cudaStream_t stream() = 0;
};

struct HostMemory final : Memory {
  std::vector<std::unique_ptr<unsigned char[]>> blocks;
  void* alloc(std::size_t bytes) override {
    blocks.emplace_back(new (std::align_val_t(64)) unsigned char[bytes + 64]());
    return blocks.back().get();
  }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void sync() override {}
  cudaStream_t stream() override { return nullptr; }
  ~HostMemory() override {
    for (auto& b : blocks) ::operator delete[](b.release(), std::align_val_t(64));
  }
};

struct DeviceMemory final : Memory {
  cudaStream_t s = nullptr;
  std::vector<void*> blocks;
  explicit DeviceMemory(int rank) {
    if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      throw std::runtime_error("fiar tools: cudaStreamCreateWithFlags on rank " + std::to_string(rank) + ": " +
                               fiar_cli::describe_cuda(e));
    }
  }
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, bytes + 64); e != cudaSuccess) {
      throw std::runtime_error("fiar tools: cudaMalloc(" + std::to_string(bytes) + "): " + fiar_cli::describe_cuda(e) +
                               ". Check free GPU memory (nvidia-smi).");
    }
    (void)cudaMemset(p, 0, bytes + 64);
    blocks.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
    (void)cudaStreamSynchronize(s);
  }
  void sync() override { (void)cudaStreamSynchronize(s); }
  cudaStream_t stream() override { return s; }
  ~DeviceMemory() override {
    (void)cudaStreamSynchronize(s);
    for (void* p : blocks) (void)cudaFree(p);
    (void)cudaStreamDestroy(s);
  }
};

// The MoE finalize calls of the tools: kMoeTopK experts per token; `tokens` > 0 marks a MoE call.
inline constexpr int kMoeTopK = 4;
struct MoeShape {
  int tokens = 0;
  int hidden = 0;
  [[nodiscard]] int rows() const { return tokens * kMoeTopK + 1; }  // the last row padding, never referenced
};
// Rank r's row of `in` holding token t's k-th expert, or -1 (none); and its router weight.
inline int moe_row(int r, int t, int k, int tokens) {
  if ((t + k + r) % 4 == 0) return -1;
  return ((t * kMoeTopK + k) * 5 + r) % (tokens * kMoeTopK);
}
inline float moe_weight(int r, int t, int k) { return 0.25f * static_cast<float>(1 + (t + k + r) % 3); }

// Rank r's contribution to element i at iteration it, as a value of T: its input, or for a MoE call the finalize of
// its expert rows (fp32 fma in k order, plus the shared expert, one rounding to T; rows and shared expert from
// input_value of ranks r + 200 and r + 400), -0 read as +0.
template <class T>
float contribution(int r, int it, std::size_t i, const MoeShape& moe) {
  auto value = [](float x) { return fiar::algo::to_float(fiar::algo::from_float<T>(x)); };
  if (moe.tokens == 0) return value(input_value(r, it, i)) + 0.0f;
  const int h = static_cast<int>(i % static_cast<std::size_t>(moe.hidden));
  const int t = static_cast<int>(i / static_cast<std::size_t>(moe.hidden));
  float acc = 0.0f;
  for (int k = 0; k < kMoeTopK; ++k) {
    const int row = moe_row(r, t, k, moe.tokens);
    if (row < 0) continue;
    acc = std::fma(value(input_value(r + 200, it, static_cast<std::size_t>(row) * moe.hidden + h)), moe_weight(r, t, k),
                   acc);
  }
  acc += value(input_value(r + 400, it, i));
  return value(acc) + 0.0f;
}

template <class T>
void verify(const std::vector<T>& out, int world, int it, Check& res, const MoeShape& moe = {}) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < world; ++r) {
      const double x = static_cast<double>(contribution<T>(r, it, i, moe));
      exact += x;
      abs_sum += std::fabs(x);
    }
    const double got = static_cast<double>(fiar::algo::to_float(out[i]));
    const double err = std::fabs(got - exact);
    const double bound =
        unit_roundoff<T>() * std::fabs(exact) + (world - 1) * std::ldexp(1.0, -24) * abs_sum + subnormal_step<T>();
    if (!(err <= bound * (1 + 1e-6))) ++res.mismatches;
    res.max_error = std::max(res.max_error, err);
  }
}

template <class T>
float f32(T x) {
  return fiar::algo::to_float(x);
}
template <class T>
T round_to(float x) {
  return fiar::algo::from_float<T>(x);
}

// The FP8 group size the tools use for T and a hidden size: 128 elements where that divides it, else the largest
// power-of-two number of 16-byte vectors below it that does.
template <class T>
int group_size_of(int hidden) {
  const int per_vec = static_cast<int>(16 / sizeof(T));
  int g = per_vec;
  while (g * 2 <= 128 && hidden % (g * 2) == 0) g *= 2;
  return g;
}

// The exponent of the smallest power of two at or above y > 0 (frexp: y = m x 2^e, m in [0.5, 1); a power of two when
// m = 0.5): the FP8 groups' scale and MXFP8's scale byte, restated.
inline int pow2_exponent_at_or_above(float y) {
  int e = 0;
  return std::frexp(y, &e) == 0.5f ? e - 1 : e;
}

// Verifies one call of a fused pattern on one rank: residual_out bit-exact against the fp32 rank-order sum
// plus the residual (RmsNorm: no residual, the sum is normalized; the pre/post norm: residual_out within the norm's
// bound of the first norm of the sum plus the residual, the second norm from the kernel's residual_out); norm_out
// within one ulp of T of the fp64 RMSNorm (plus one subnormal step of T, for results that round into T's subnormal
// range); the quantized outputs bit-exact against the quantization of the kernel's own norm_out.
template <class T>
void verify_fused(fiar::Pattern pattern, int tokens, int hidden, int world, int it, const std::vector<T>& residual,
                  const std::vector<T>& gamma, const std::vector<T>& residual_out, const std::vector<T>& norm,
                  const std::vector<std::uint8_t>& quant, const std::vector<float>& scale_out,
                  const std::vector<std::uint8_t>& block_scales, float scale, const std::vector<T>& gamma_pre,
                  Check& res, const MoeShape& moe = {}) {
  const int H = hidden;
  const double ulp = unit_roundoff<T>() * 2;
  auto uses = [&](fiar::FusedTensor t) {
    return fiar::pattern_traits(pattern).use[static_cast<int>(t)] != fiar::TensorUse::Unused;
  };
  const bool prepost = uses(fiar::FusedTensor::GammaPre), with_residual = uses(fiar::FusedTensor::ResidualIn);
  for (int t = 0; t < tokens; ++t) {
    double squares = 0;
    std::vector<float> y(static_cast<std::size_t>(H));
    auto sum_at = [&](std::size_t i) {
      float acc = 0.0f;
      for (int r = 0; r < world; ++r) acc += contribution<T>(r, it, i, moe);
      T sum = round_to<T>(acc);
      if (f32(sum) == 0.0f) sum = round_to<T>(0.0f);
      return sum;
    };
    double pre_inv_rms = 0;
    if (prepost) {
      double ss = 0;
      for (int h = 0; h < H; ++h)
        ss += static_cast<double>(f32(sum_at(static_cast<std::size_t>(t) * H + h))) *
              f32(sum_at(static_cast<std::size_t>(t) * H + h));
      pre_inv_rms = 1.0 / std::sqrt(ss / H + 1e-6);
    }
    for (int h = 0; h < H; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * H + h;
      const T sum = sum_at(i);
      T yy = with_residual ? round_to<T>(f32(sum) + f32(residual[i])) : sum;
      if (prepost) {
        const double p = f32(sum) * pre_inv_rms * f32(gamma_pre[static_cast<std::size_t>(h)]);
        const double got = f32(residual_out[i]);
        if (std::fabs(got - (p + f32(residual[i]))) >
            ulp * (std::fabs(p) + std::fabs(got)) + 1e-6 * std::fabs(p) + 2 * subnormal_step<T>())
          ++res.mismatches;
        yy = residual_out[i];
      } else if (with_residual && f32(yy) != f32(residual_out[i])) {
        ++res.mismatches;
      }
      y[static_cast<std::size_t>(h)] = f32(yy);
      squares += static_cast<double>(f32(yy)) * f32(yy);
    }
    const double inv_rms = 1.0 / std::sqrt(squares / H + 1e-6);
    float amax = 0.0f;
    for (int h = 0; h < H; ++h) {
      const std::size_t i = static_cast<std::size_t>(t) * H + h;
      const double want = y[static_cast<std::size_t>(h)] * inv_rms * f32(gamma[static_cast<std::size_t>(h)]);
      const double err = std::fabs(f32(norm[i]) - want);
      if (err > ulp * std::fabs(want) + 1e-6 * std::fabs(want) + subnormal_step<T>()) ++res.mismatches;
      res.max_error = std::max(res.max_error, err);
      amax = std::max(amax, std::fabs(f32(norm[i])));
    }
    // The largest |norm_out| of elements first .. first + n - 1 of token t (a block's or a group's amax).
    auto largest = [&](int first, int n) {
      float m = 0.0f;
      for (int j = 0; j < n; ++j) m = std::max(m, std::fabs(f32(norm[static_cast<std::size_t>(t) * H + first + j])));
      return m;
    };
    if (pattern == fiar::Pattern::ResidualRmsNormFp8 || pattern == fiar::Pattern::ResidualRmsNormFp8Dynamic) {
      const bool dynamic = pattern == fiar::Pattern::ResidualRmsNormFp8Dynamic;
      const float token_scale = std::max(amax / 448.0f, 1.0f / (512.0f * 448.0f));
      if (dynamic && scale_out[static_cast<std::size_t>(t)] != token_scale) ++res.mismatches;
      for (int h = 0; h < H; ++h) {
        const std::size_t i = static_cast<std::size_t>(t) * H + h;
        const float q = dynamic ? f32(norm[i]) / token_scale : f32(norm[i]) * (1.0f / scale);
        if (quant[i] != static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3)))
          ++res.mismatches;
      }
    } else if (pattern == fiar::Pattern::ResidualRmsNormFp8Group) {
      // Each group's scale: the power of two at or above max(amax / 448, 1e-10), stored as its exponent byte (packed
      // 4 groups per int32, columns of round_up(tokens, 4) rows).
      const int g = group_size_of<T>(H);
      const std::size_t rows = static_cast<std::size_t>((tokens + 3) / 4 * 4);
      for (int k = 0; k < H / g; ++k) {
        const int e = pow2_exponent_at_or_above(std::max(largest(k * g, g) / 448.0f, 1e-10f));
        const float y = std::ldexp(1.0f, e);
        if (block_scales[4 * (static_cast<std::size_t>(k / 4) * rows + static_cast<std::size_t>(t)) +
                         static_cast<std::size_t>(k % 4)] != e + 127)
          ++res.mismatches;
        for (int j = 0; j < g; ++j) {
          const std::size_t i = static_cast<std::size_t>(t) * H + k * g + j;
          if (quant[i] != static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(f32(norm[i]) / y, __NV_SATFINITE, __NV_E4M3)))
            ++res.mismatches;
        }
      }
    } else if (pattern == fiar::Pattern::ResidualRmsNormMxfp8) {
      // Each 32-element block's scale: the exponent of the power of two at or above amax / 448, biased (0 for an
      // all-zero block, whose codes are zero); the codes n x 2^(127 - byte).
      for (int k = 0; k < H / 32; ++k) {
        const float block_max = largest(k * 32, 32);
        const int sf = block_max == 0.0f ? 0 : std::max(0, pow2_exponent_at_or_above(block_max / 448.0f) + 127);
        if (block_scales[fiar::algo::mxfp8_scale_offset(t, k, H, fiar::ScaleLayout::Swizzled128x4)] != sf)
          ++res.mismatches;
        const float factor = block_max == 0.0f ? 0.0f : std::ldexp(1.0f, 127 - sf);
        for (int j = 0; j < 32; ++j) {
          const std::size_t i = static_cast<std::size_t>(t) * H + k * 32 + j;
          if (quant[i] !=
              static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(f32(norm[i]) * factor, __NV_SATFINITE, __NV_E4M3)))
            ++res.mismatches;
        }
      }
    } else if (pattern == fiar::Pattern::ResidualRmsNormNvfp4) {
      for (int k = 0; k < H / 16; ++k) {
        const float block_max = largest(k * 16, 16);
        // FlashInfer's order: g x (amax x 1/6).
        const auto sf = static_cast<std::uint8_t>(
            __nv_cvt_float_to_fp8(scale * (block_max * (1.0f / 6.0f)), __NV_SATFINITE, __NV_E4M3));
        if (block_scales[fiar::algo::nvfp4_scale_offset(t, k, H, fiar::ScaleLayout::Swizzled128x4)] != sf)
          ++res.mismatches;
        const float sf_value = __half2float(__half(__nv_cvt_fp8_to_halfraw(sf, __NV_E4M3)));
        const float factor = sf_value == 0.0f ? 0.0f : scale / sf_value;
        for (int j = 0; j < 16; ++j) {
          const std::uint8_t byte = quant[static_cast<std::size_t>(t) * (H / 2) + (k * 16 + j) / 2];
          const std::uint8_t nibble = j % 2 == 0 ? (byte & 0xf) : (byte >> 4);
          const float n = f32(norm[static_cast<std::size_t>(t) * H + k * 16 + j]);
          if (nibble != (__nv_cvt_float_to_fp4(n * factor, __NV_E2M1, cudaRoundNearest) & 0xf)) ++res.mismatches;
        }
      }
    }
  }
}

/// One rank's tensors of one fused call of pattern P (every tensor the pattern uses, the optional ones too, from the
/// pattern's row of fiar's table), in `mem`: inputs for iteration `it` uploaded by set_inputs(), outputs checked
/// against the reference by check(), and their bytes (to compare ranks) by output_bytes().
template <fiar::Pattern P, class T>
struct CallTensors {
  static constexpr fiar::PatternTraits kTraits = fiar::pattern_traits(P);
  static constexpr bool fused = kTraits.norm;
  static constexpr bool nvfp4 = kTraits.quant == fiar::Quant::Nvfp4;
  static constexpr bool group = kTraits.quant == fiar::Quant::Fp8Group;
  static constexpr bool moe = kTraits.prologue == fiar::Prologue::MoeFinalize;
  static constexpr bool used(fiar::FusedTensor t) {
    return kTraits.use[static_cast<int>(t)] != fiar::TensorUse::Unused;
  }

  int tokens, hidden;
  std::size_t count, bytes, quant_bytes, sf_bytes;
  float scale = nvfp4 ? 448.0f * 6.0f / 4.0f : 0.01f;  // nvfp4 global scale, or the static fp8 scale
  std::vector<T> host_in, out, residual, gamma, gamma_pre, norm, residual_out;
  std::vector<std::uint8_t> quant, block_scales;
  std::vector<float> scale_out;
  MoeShape moe_shape;  ///< MoE finalize calls: their shape (else tokens 0)
  std::vector<T> moe_in, moe_shared;
  std::vector<int> moe_idx;
  std::vector<float> moe_scale;
  fiar::FusedArgs<T> a;

  CallTensors(Memory& mem, int num_tokens, int hidden_dim)
      : tokens(num_tokens),
        hidden(hidden_dim),
        count(static_cast<std::size_t>(num_tokens) * static_cast<std::size_t>(hidden_dim)),
        bytes(count * sizeof(T)),
        quant_bytes(nvfp4 ? count / 2 : count),
        sf_bytes(group ? fiar::algo::fp8_group_scale_bytes(num_tokens, hidden_dim, group_size_of<T>(hidden_dim),
                                                           fiar::GroupScale::Ue8m0Packed)
                 : kTraits.quant == fiar::Quant::Mxfp8
                     ? fiar::algo::mxfp8_scale_bytes(num_tokens, hidden_dim, fiar::ScaleLayout::Swizzled128x4)
                     : fiar::algo::nvfp4_scale_bytes(num_tokens, hidden_dim, fiar::ScaleLayout::Swizzled128x4)),
        host_in(count),
        out(count),
        residual(count),
        gamma(static_cast<std::size_t>(hidden_dim)),
        gamma_pre(static_cast<std::size_t>(hidden_dim)),
        norm(count),
        residual_out(count),
        quant(quant_bytes),
        block_scales(sf_bytes),
        scale_out(static_cast<std::size_t>(num_tokens)) {
    for (int h = 0; h < hidden; ++h) {
      gamma[static_cast<std::size_t>(h)] = round_to<T>(0.5f + 0.125f * static_cast<float>(h % 5));
      gamma_pre[static_cast<std::size_t>(h)] = round_to<T>(0.75f + 0.125f * static_cast<float>(h % 3));
    }
    a.num_tokens = tokens;
    if constexpr (moe) {
      moe_shape = MoeShape{tokens, hidden};
      const std::size_t rows = static_cast<std::size_t>(moe_shape.rows());
      const std::size_t experts = static_cast<std::size_t>(tokens) * kMoeTopK;
      moe_in.resize(rows * static_cast<std::size_t>(hidden));
      moe_shared.resize(count);
      moe_idx.resize(experts);
      moe_scale.resize(experts);
      a.in = static_cast<T*>(mem.alloc(moe_in.size() * sizeof(T)));
      a.expanded_idx_to_permuted_idx = static_cast<int*>(mem.alloc(experts * sizeof(int)));
      a.expert_scale = static_cast<float*>(mem.alloc(experts * sizeof(float)));
      a.shared_expert_out = static_cast<T*>(mem.alloc(bytes));
      a.top_k = kMoeTopK;
      a.num_permuted_rows = moe_shape.rows();
    } else {
      a.in = static_cast<T*>(mem.alloc(bytes));
    }
    a.eps = 1e-6f;
    a.group_size = group_size_of<T>(hidden);
    if (used(fiar::FusedTensor::Out)) a.out = static_cast<T*>(mem.alloc(bytes));
    if (used(fiar::FusedTensor::ResidualIn)) a.residual_in = static_cast<T*>(mem.alloc(bytes));
    if (used(fiar::FusedTensor::ResidualOut)) a.residual_out = static_cast<T*>(mem.alloc(bytes));
    if (used(fiar::FusedTensor::Gamma)) {
      a.gamma = static_cast<T*>(mem.alloc(static_cast<std::size_t>(hidden) * sizeof(T)));
      mem.upload(const_cast<T*>(a.gamma), gamma.data(), gamma.size() * sizeof(T));
    }
    if (used(fiar::FusedTensor::GammaPre)) {
      a.gamma_pre = static_cast<T*>(mem.alloc(static_cast<std::size_t>(hidden) * sizeof(T)));
      mem.upload(const_cast<T*>(a.gamma_pre), gamma_pre.data(), gamma_pre.size() * sizeof(T));
    }
    if (used(fiar::FusedTensor::NormOut)) a.norm_out = static_cast<T*>(mem.alloc(bytes));
    if (used(fiar::FusedTensor::Scale)) {
      float* s = static_cast<float*>(mem.alloc(sizeof(float)));
      mem.upload(s, &scale, sizeof(float));
      a.scale = s;
    }
    if (used(fiar::FusedTensor::QuantOut)) a.quant_out = mem.alloc(quant_bytes);
    if (used(fiar::FusedTensor::ScaleOut)) a.scale_out = static_cast<float*>(mem.alloc(scale_out.size() * 4));
    if (used(fiar::FusedTensor::BlockScaleOut)) a.block_scale_out = mem.alloc(sf_bytes);
    mem.sync();
  }

  /// Rank `rank`'s input (and the residual) of iteration `it`.
  void set_inputs(Memory& mem, int rank, int it) {
    for (std::size_t i = 0; i < count; ++i) {
      host_in[i] = round_to<T>(input_value(rank, it, i));
      residual[i] = round_to<T>(input_value(1000, it, i));
    }
    if constexpr (moe) {  // the expert rows, the map, the weights and the shared expert (contribution())
      for (std::size_t i = 0; i < moe_in.size(); ++i) moe_in[i] = round_to<T>(input_value(rank + 200, it, i));
      for (std::size_t i = 0; i < count; ++i) moe_shared[i] = round_to<T>(input_value(rank + 400, it, i));
      for (int t = 0; t < tokens; ++t) {
        for (int k = 0; k < kMoeTopK; ++k) {
          moe_idx[static_cast<std::size_t>(t) * kMoeTopK + k] = moe_row(rank, t, k, tokens);
          moe_scale[static_cast<std::size_t>(t) * kMoeTopK + k] = moe_weight(rank, t, k);
        }
      }
      mem.upload(const_cast<T*>(a.in), moe_in.data(), moe_in.size() * sizeof(T));
      mem.upload(const_cast<T*>(a.shared_expert_out), moe_shared.data(), bytes);
      mem.upload(const_cast<int*>(a.expanded_idx_to_permuted_idx), moe_idx.data(), moe_idx.size() * sizeof(int));
      mem.upload(const_cast<float*>(a.expert_scale), moe_scale.data(), moe_scale.size() * sizeof(float));
    } else {
      mem.upload(const_cast<T*>(a.in), host_in.data(), bytes);
    }
    if constexpr (used(fiar::FusedTensor::ResidualIn))
      mem.upload(const_cast<T*>(a.residual_in), residual.data(), bytes);
  }

  /// Downloads the outputs (after the stream finished the call) and checks them as iteration `it` of `world` ranks.
  void check(Memory& mem, int world, int it, Check& res) {
    if constexpr (!fused) {
      mem.download(out.data(), a.out, bytes);
      verify<T>(out, world, it, res, moe_shape);
    } else {
      if constexpr (used(fiar::FusedTensor::ResidualOut)) mem.download(residual_out.data(), a.residual_out, bytes);
      mem.download(norm.data(), a.norm_out, bytes);
      if (a.quant_out != nullptr) mem.download(quant.data(), a.quant_out, quant_bytes);
      if (a.scale_out != nullptr) mem.download(scale_out.data(), a.scale_out, scale_out.size() * 4);
      if (a.block_scale_out != nullptr) mem.download(block_scales.data(), a.block_scale_out, sf_bytes);
      verify_fused<T>(P, tokens, hidden, world, it, residual, gamma, residual_out, norm, quant, scale_out, block_scales,
                      scale, gamma_pre, res, moe_shape);
    }
  }

  /// The bytes of the outputs check() downloaded last.
  [[nodiscard]] std::vector<unsigned char> output_bytes() const {
    std::vector<unsigned char> b;
    auto append = [&b](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      b.insert(b.end(), c, c + n);
    };
    if constexpr (!fused) {
      append(out.data(), bytes);
    } else {
      append(residual_out.data(), bytes);
      append(norm.data(), bytes);
      append(quant.data(), quant.size());
      append(scale_out.data(), scale_out.size() * 4);
      append(block_scales.data(), block_scales.size());
    }
    return b;
  }
};

}  // namespace fiar_tools
