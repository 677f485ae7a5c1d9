// fiar/trtllm.hpp — Workspace<TrtllmPolicy, T, Platform>: the single-node peer-mapped backend.
// Contract: creation is collective and verified (every rank agrees on the configuration or every rank
// throws the same error); each call is validated before anything is launched; a kernel that waited past
// the deadline makes this and every later call throw fiar::timeout_error until the workspace is recreated.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <utility>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "algo/lamport.hpp"
#include "bootstrap.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "policy.hpp"
#include "resolve.hpp"
#include "topology.hpp"
#include "version.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

/// The built-in strategy table: per-rank message bytes (tokens x hidden x sizeof(T)) up to which one-shot
/// is faster, by architecture and world size. Anchored on the per-GPU tables inference engines measured
/// for this protocol pair (H100 / B200); replace it with WorkspaceConfig::oneshot_max_bytes after
/// measuring with the benchmark.
constexpr std::size_t default_oneshot_max_bytes(int arch, int world_size) {
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  const bool blackwell = arch >= 100;
  if (world_size <= 2) return 32 * MiB;
  if (world_size <= 4) return blackwell ? 4 * MiB : 2 * MiB;
  if (world_size <= 8) return blackwell ? 1 * MiB : 512 * KiB;
  return blackwell ? 512 * KiB : 256 * KiB;
}

/// Strategy::Auto resolved: one-shot for a single rank, for fewer tokens than ranks (two-shot would leave
/// owners idle) and up to the threshold; two-shot beyond. Depends only on values every rank shares.
constexpr Strategy choose_strategy(int world_size, int num_tokens, std::size_t message_bytes,
                                   std::size_t oneshot_max_bytes) {
  if (world_size == 1 || num_tokens < world_size || message_bytes <= oneshot_max_bytes) return Strategy::OneShot;
  return Strategy::TwoShot;
}

constexpr std::string_view to_string(Strategy s) {
  switch (s) {
    case Strategy::Auto: return "auto";
    case Strategy::OneShot: return "oneshot";
    case Strategy::TwoShot: return "twoshot";
  }
  return "invalid";
}

namespace detail {

// What every rank exchanges at creation: its view of the configuration, or why it rejected it.
struct CreationRecord {
  std::array<char, 768> error;
  std::uint32_t backend, dtype_bytes, dtype_is_bf16, world_size, max_token_num, hidden_dim;
  std::uint32_t version_major, version_minor, version_patch, timeout_ms, oneshot_at_max_tokens, reserved;
  std::uint64_t oneshot_max_bytes, buffer_words;
};

inline std::string describe_digest(const CreationRecord& r) {
  return "backend " + std::string(to_string(static_cast<Backend>(r.backend))) + ", dtype " +
         (r.dtype_bytes == 4 ? "float" : (r.dtype_is_bf16 ? "bf16" : "half")) + ", world_size " +
         std::to_string(r.world_size) + ", max_token_num " + std::to_string(r.max_token_num) + ", hidden_dim " +
         std::to_string(r.hidden_dim) + ", timeout " + std::to_string(r.timeout_ms) + " ms, oneshot_max_bytes " +
         std::to_string(r.oneshot_max_bytes) + ", oneshot_at_max_tokens " + std::to_string(r.oneshot_at_max_tokens) +
         ", fiar " + std::to_string(r.version_major) + "." + std::to_string(r.version_minor) + "." +
         std::to_string(r.version_patch);
}

inline std::string rank_mask_text(std::uint32_t mask) {
  std::string s;
  for (int r = 0; r < 32; ++r) {
    if (mask & (1u << r)) s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return s;
}

inline bool same_digest(const CreationRecord& a, const CreationRecord& b) {
  return a.backend == b.backend && a.dtype_bytes == b.dtype_bytes && a.dtype_is_bf16 == b.dtype_is_bf16 &&
         a.world_size == b.world_size && a.max_token_num == b.max_token_num && a.hidden_dim == b.hidden_dim &&
         a.version_major == b.version_major && a.version_minor == b.version_minor &&
         a.version_patch == b.version_patch && a.timeout_ms == b.timeout_ms &&
         a.oneshot_at_max_tokens == b.oneshot_at_max_tokens && a.oneshot_max_bytes == b.oneshot_max_bytes &&
         a.buffer_words == b.buffer_words;
}

// Runs local checks, then agrees with every rank: either all return, or all throw the same error.
template <Bootstrap B>
void agree_on_creation(B& boot, CreationRecord mine, const std::string& local_error) {
  mine.error.fill('\0');
  std::memcpy(mine.error.data(), local_error.data(), std::min(local_error.size(), mine.error.size() - 1));
  const auto all = all_gather_value(boot, mine);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error[0] != '\0') {
      std::string what(all[r].error.data());
      if (static_cast<int>(r) == boot.rank()) throw std::invalid_argument(what);
      if (what.rfind("fiar: ", 0) == 0) what.erase(0, 6);
      throw std::invalid_argument("fiar: workspace creation failed because rank " + std::to_string(r) +
                                  " rejected it: " + what);
    }
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!same_digest(all[r], all[0])) {
      throw std::invalid_argument("fiar: workspace configurations differ between ranks: rank 0 has {" +
                                  describe_digest(all[0]) + "}, rank " + std::to_string(r) + " has {" +
                                  describe_digest(all[r]) +
                                  "}. Fix: create the workspace with the same type, topology and WorkspaceConfig on "
                                  "every rank, with the same fiar version.");
    }
  }
}

}  // namespace detail

/// The trtllm backend: every rank of one node maps every other rank's buffers and runs the Lamport
/// one-shot or two-shot protocol over them. World sizes 1 to 16 (1 copies the input).
template <ReduceType T, class Platform>
class Workspace<TrtllmPolicy, T, Platform> {
 public:
  using policy_type = TrtllmPolicy;
  using value_type = T;
  using platform_type = Platform;

  /// Words of one Lamport buffer for this configuration (one of three; a call uses one).
  static std::size_t buffer_words(int world_size, int arch, const WorkspaceConfig& cfg) {
    const int vecs = vecs_per_token(cfg.hidden_dim);
    const std::size_t threshold = cfg.oneshot_max_bytes.value_or(default_oneshot_max_bytes(arch, world_size));
    const std::size_t row_bytes = static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T);
    // Auto runs one-shot up to the threshold and whenever tokens < world size (choose_strategy).
    const std::size_t auto_oneshot_tokens = std::max<std::size_t>(threshold / row_bytes, world_size - 1);
    const int oneshot_tokens = cfg.oneshot_at_max_tokens
                                   ? cfg.max_token_num
                                   : static_cast<int>(std::min<std::size_t>(auto_oneshot_tokens, cfg.max_token_num));
    return std::max(algo::oneshot_words(world_size, std::max(oneshot_tokens, 1), vecs),
                    algo::twoshot_words(world_size, cfg.max_token_num, vecs));
  }

  /// Bytes of rank-visible memory each rank allocates (three Lamport buffers).
  static std::size_t required_bytes(const Topology& topo, const WorkspaceConfig& cfg) {
    return algo::kLamportBuffers * buffer_words(topo.world_size, topo.arch, cfg) * sizeof(std::uint32_t);
  }

  /// "" when this backend can serve the configuration on the topology, else why not.
  static std::string why_not(const Topology& topo, const WorkspaceConfig& cfg) {
    if (!can_run_on(Backend::Trtllm, topo)) {
      try {
        check_topology<TrtllmPolicy>(topo);
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
    }
    return config_error(topo, cfg);
  }
  static bool can_implement(const Topology& topo, const WorkspaceConfig& cfg) {
    try {
      validate_topology(topo);
    } catch (const std::invalid_argument&) {
      return false;
    }
    return why_not(topo, cfg).empty();
  }

  /// Collective: every rank of the group constructs its workspace with the same topology (bar rank) and
  /// configuration. Throws std::invalid_argument (on every rank alike) when the topology or configuration
  /// cannot work, before allocating anything; fiar::timeout_error when a rank does not arrive.
  template <Bootstrap B>
  Workspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg,
            const typename Platform::Options& options = typename Platform::Options{})
      : platform_(options), topo_(topo), cfg_(cfg) {
    std::string error;
    try {
      check_topology<TrtllmPolicy>(topo);
      if (topo.world_size != boot.size() || topo.rank != boot.rank()) {
        throw std::invalid_argument("fiar: the topology says world_size " + std::to_string(topo.world_size) +
                                    ", rank " + std::to_string(topo.rank) + ", but the bootstrap says size " +
                                    std::to_string(boot.size()) + ", rank " + std::to_string(boot.rank()) +
                                    ". Fix: discover the topology over the same bootstrap (discover_topology(boot)).");
      }
      if (std::string e = config_error(topo, cfg); !e.empty()) throw std::invalid_argument(e);
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    detail::CreationRecord mine{};
    mine.backend = static_cast<std::uint32_t>(Backend::Trtllm);
    mine.dtype_bytes = sizeof(T);
    mine.dtype_is_bf16 = std::is_same_v<T, __nv_bfloat16> ? 1 : 0;
    mine.world_size = static_cast<std::uint32_t>(topo.world_size);
    mine.max_token_num = static_cast<std::uint32_t>(cfg.max_token_num);
    mine.hidden_dim = static_cast<std::uint32_t>(cfg.hidden_dim);
    mine.version_major = version_major;
    mine.version_minor = version_minor;
    mine.version_patch = version_patch;
    mine.timeout_ms = static_cast<std::uint32_t>(cfg.timeout.count());
    mine.oneshot_at_max_tokens = cfg.oneshot_at_max_tokens ? 1 : 0;
    mine.oneshot_max_bytes = oneshot_threshold();
    mine.buffer_words = error.empty() ? buffer_words(topo.world_size, topo.arch, cfg) : 0;
    detail::agree_on_creation(boot, mine, error);

    buffer_words_ = mine.buffer_words;
    const std::size_t region_words = algo::kLamportBuffers * buffer_words_;
    buffers_ = platform_.allocate_shared(boot, region_words * sizeof(std::uint32_t));
    state_ = static_cast<algo::LamportState*>(platform_.allocate_local(sizeof(algo::LamportState)));
    error_ = static_cast<algo::ErrorRecord*>(platform_.allocate_host_visible(sizeof(algo::ErrorRecord)));
    platform_.fill_words(buffers_[static_cast<std::size_t>(topo.rank)], region_words, detail::kSentinelWord);
    platform_.synchronize();
    boot.barrier();  // no rank pushes into a buffer before its owner has filled it with sentinels
  }

  Workspace(Workspace&& other) noexcept
      : platform_(std::move(other.platform_)),
        topo_(other.topo_),
        cfg_(other.cfg_),
        buffer_words_(other.buffer_words_),
        buffers_(std::move(other.buffers_)),
        state_(std::exchange(other.state_, nullptr)),
        error_(std::exchange(other.error_, nullptr)),
        last_strategy_(other.last_strategy_) {}
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      platform_ = std::move(other.platform_);
      topo_ = other.topo_;
      cfg_ = other.cfg_;
      buffer_words_ = other.buffer_words_;
      buffers_ = std::move(other.buffers_);
      state_ = std::exchange(other.state_, nullptr);
      error_ = std::exchange(other.error_, nullptr);
      last_strategy_ = other.last_strategy_;
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() = default;

  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Platform& platform() { return platform_; }
  [[nodiscard]] std::size_t oneshot_threshold() const {
    return cfg_.oneshot_max_bytes.value_or(default_oneshot_max_bytes(topo_.arch, topo_.world_size));
  }

  /// The strategy Strategy::Auto takes for a call of num_tokens tokens (the same on every rank).
  [[nodiscard]] Strategy strategy_for(int num_tokens) const {
    return choose_strategy(topo_.world_size, num_tokens,
                           static_cast<std::size_t>(num_tokens) * static_cast<std::size_t>(cfg_.hidden_dim) * sizeof(T),
                           oneshot_threshold());
  }

  /// Whether one call of num_tokens tokens with that strategy fits: one of the three Lamport buffers
  /// backs a call, so this is the real per-call capacity (not total bytes / row bytes).
  [[nodiscard]] bool is_buffer_size_sufficient(int num_tokens, Strategy s = Strategy::Auto) const {
    if (num_tokens < 1 || num_tokens > cfg_.max_token_num) return false;
    if (s == Strategy::Auto) s = strategy_for(num_tokens);
    return words_for(s, num_tokens) <= buffer_words_;
  }

  /// Sums `in` over all ranks into `out` ([num_tokens, hidden_dim] each; out may equal in). Collective:
  /// every rank calls it with the same num_tokens and strategy, in the same order. Everything is validated
  /// before anything is launched; std::invalid_argument names the bad value and the limit.
  void allreduce(const T* in, T* out, int num_tokens, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    FusedArgs<T> a;
    a.in = in;
    a.out = out;
    a.num_tokens = num_tokens;
    run<Pattern::AllReduce>(a, stream, strategy);
  }

  /// All-reduce fused with the pattern's epilogue (residual add, RMSNorm, FP8 / NVFP4 quantization).
  /// Collective like allreduce(); `a` is checked against the pattern before anything is launched.
  template <Pattern P>
  void run(const FusedArgs<T>& a, cudaStream_t stream = nullptr, Strategy strategy = Strategy::Auto) {
    check();
    validate_call(a.in, a.out, a.num_tokens, strategy, P);
    validate_fused<P>(a);
    const Strategy s = strategy == Strategy::Auto ? strategy_for(a.num_tokens) : strategy;
    algo::LamportParams<T> p{};
    p.in = a.in;
    p.out = a.out;
    p.num_tokens = a.num_tokens;
    p.vecs_per_token = vecs_per_token(cfg_.hidden_dim);
    p.world_size = topo_.world_size;
    p.rank = topo_.rank;
    for (int r = 0; r < topo_.world_size; ++r) p.buffers[r] = buffers_[static_cast<std::size_t>(r)];
    p.buffer_words = buffer_words_;
    p.state = state_;
    p.error = error_;
    p.timeout_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.timeout).count());
    p.epi = algo::EpilogueParams<T>{a.residual_in,
                                    a.residual_out,
                                    a.gamma,
                                    a.norm_out,
                                    static_cast<std::uint8_t*>(a.quant_out),
                                    a.scale,
                                    a.scale_out,
                                    static_cast<std::uint8_t*>(a.block_scale_out),
                                    a.eps,
                                    a.weight_bias,
                                    a.layout};
    platform_.template launch<P, T>(s, p, stream);
    last_strategy_ = s;
    check_if_synchronous();
  }

  /// The architecture the kernels run on: the GPU's on CudaPlatform, the topology's on the host emulator.
  [[nodiscard]] int arch() const { return platform_.arch() != 0 ? platform_.arch() : topo_.arch; }

  /// The strategy the last call ran.
  [[nodiscard]] Strategy last_strategy() const { return last_strategy_; }

  /// Throws fiar::timeout_error if a kernel of this workspace gave up waiting (then every later call throws
  /// too: the protocol state is lost; recreate the workspace on every rank).
  void check() const {
    if (error_ == nullptr) {
      throw std::logic_error("fiar: this workspace was moved from. Fix: call the workspace it was moved to.");
    }
    if (Platform::read_word(&error_->code) == algo::kErrorNone) return;
    const std::uint32_t missing = Platform::read_word(&error_->missing);
    const std::uint32_t stalled = Platform::read_word(&error_->stalled);
    std::string waited = missing != 0 ? "waiting for data from rank(s) " + detail::rank_mask_text(missing)
                                      : "waiting for results reduced by rank(s) " + detail::rank_mask_text(stalled) +
                                            " (two-shot owners: one of them, or a rank they wait for, is missing)";
    throw timeout_error("fiar: trtllm all-reduce on rank " + std::to_string(topo_.rank) + " gave up after " +
                        std::to_string(cfg_.timeout.count()) + " ms " + waited + " (call " +
                        std::to_string(Platform::read_word(&error_->call)) +
                        "): a rank crashed, hung, or launched a different sequence of collectives. Fix: find "
                        "that rank's failure; the workspace is unusable now, so recreate it on every rank.");
  }

 private:
  static int vecs_per_token(int hidden_dim) {
    return static_cast<int>(static_cast<std::size_t>(hidden_dim) * sizeof(T) / 16);
  }

  static std::string config_error(const Topology& topo, const WorkspaceConfig& cfg) {
    const std::string dt(dtype_name<T>());
    if (cfg.max_token_num < 1) {
      return "fiar: WorkspaceConfig::max_token_num = " + std::to_string(cfg.max_token_num) +
             "; allowed: 1 or more. Fix: pass the most tokens one call will reduce.";
    }
    if (cfg.hidden_dim < 1 || (static_cast<std::size_t>(cfg.hidden_dim) * sizeof(T)) % 16 != 0) {
      return "fiar: WorkspaceConfig::hidden_dim = " + std::to_string(cfg.hidden_dim) + " for " + dt +
             "; allowed: a positive multiple of " + std::to_string(16 / sizeof(T)) +
             " (16-byte vectors). Fix: pad the hidden dimension.";
    }
    if (cfg.timeout.count() < 1 || cfg.timeout > std::chrono::hours(24)) {
      return "fiar: WorkspaceConfig::timeout = " + std::to_string(cfg.timeout.count()) +
             " ms; allowed: 1 ms to 24 h. Fix: pass a bound a healthy call never reaches (default 30 s).";
    }
    const std::size_t words = buffer_words(topo.world_size, topo.arch, cfg);
    if (words > std::numeric_limits<std::uint32_t>::max()) {
      return "fiar: the trtllm workspace for max_token_num " + std::to_string(cfg.max_token_num) + ", hidden_dim " +
             std::to_string(cfg.hidden_dim) + " and world_size " + std::to_string(topo.world_size) + " needs " +
             std::to_string(words * 4) + " bytes per Lamport buffer; allowed: at most 16 GiB. Fix: lower "
             "max_token_num (or oneshot_max_bytes / oneshot_at_max_tokens).";
    }
    return "";
  }

  std::size_t words_for(Strategy s, int num_tokens) const {
    const int vecs = vecs_per_token(cfg_.hidden_dim);
    return s == Strategy::TwoShot ? algo::twoshot_words(topo_.world_size, num_tokens, vecs)
                                  : algo::oneshot_words(topo_.world_size, num_tokens, vecs);
  }

  void validate_call(const T* in, T* out, int num_tokens, Strategy strategy, Pattern pattern) const {
    const std::string where = "fiar: " + std::string(to_string(pattern)) + " on rank " + std::to_string(topo_.rank) + ": ";
    if (in == nullptr || (pattern == Pattern::AllReduce && out == nullptr)) {
      throw std::invalid_argument(where + (in == nullptr ? "in" : "out") +
                                  " is a null pointer. Fix: pass [num_tokens, hidden_dim] buffers.");
    }
    if (num_tokens < 1 || num_tokens > cfg_.max_token_num) {
      throw std::invalid_argument(where + "num_tokens = " + std::to_string(num_tokens) +
                                  "; allowed: 1 to max_token_num = " + std::to_string(cfg_.max_token_num) +
                                  ". Fix: split the call, or create the workspace with a larger max_token_num.");
    }
    if (strategy != Strategy::Auto && !is_buffer_size_sufficient(num_tokens, strategy)) {
      throw std::invalid_argument(where + std::string(to_string(strategy)) + " with num_tokens = " +
                                  std::to_string(num_tokens) + " needs " +
                                  std::to_string(words_for(strategy, num_tokens) * 4) +
                                  " bytes per Lamport buffer; this workspace has " + std::to_string(buffer_words_ * 4) +
                                  ". Fix: use Strategy::Auto, or create the workspace with oneshot_at_max_tokens.");
    }
  }

  // One tensor of a call: its name, address, bytes, alignment, and whether it is written.
  struct Tensor {
    const char* name;
    const void* ptr;
    std::size_t bytes;
    std::size_t align;
    bool output;
  };

  template <Pattern P>
  void validate_fused(const FusedArgs<T>& a) const {
    const std::string where = "fiar: " + std::string(to_string(P)) + " on rank " + std::to_string(topo_.rank) + ": ";
    const std::size_t rows = static_cast<std::size_t>(a.num_tokens);
    const std::size_t hidden = static_cast<std::size_t>(cfg_.hidden_dim);
    const std::size_t act = rows * hidden * sizeof(T);
    constexpr bool norm = P != Pattern::AllReduce;
    constexpr bool fp8 = P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic;
    constexpr bool nvfp4 = P == Pattern::ResidualRmsNormNvfp4;
    if constexpr (nvfp4) {
      if (sizeof(T) != 2) {
        throw std::invalid_argument(where + "the input is float; NVFP4 takes 16-bit input (half or bf16). Fix: "
                                    "run the all-reduce in half or bf16, or use residual_rmsnorm_fp8.");
      }
      if (arch() < 100) {
        throw std::invalid_argument(where + "NVFP4 needs sm_100 or newer, and this workspace runs on " +
                                    arch_name(arch()) +
                                    ". Fix: use residual_rmsnorm_fp8 or _fp8_dynamic on this GPU (on the host "
                                    "emulator, set Topology::arch to 100 to emulate Blackwell).");
      }
      if (cfg_.hidden_dim % algo::kNvfp4Block != 0) {
        throw std::invalid_argument(where + "hidden_dim = " + std::to_string(cfg_.hidden_dim) +
                                    "; NVFP4 needs a multiple of 16 (one e4m3 scale per 16 elements). Fix: pad "
                                    "the hidden dimension to a multiple of 16.");
      }
    }
    if constexpr (norm) {
      if (!(a.eps >= 0.0f) || !std::isfinite(a.eps) || !std::isfinite(a.weight_bias)) {
        throw std::invalid_argument(where + "eps = " + std::to_string(a.eps) + ", weight_bias = " +
                                    std::to_string(a.weight_bias) +
                                    "; allowed: a finite eps >= 0 and a finite weight_bias. Fix: pass the model's "
                                    "RMSNorm epsilon and 0 (or 1 for (1 + gamma) norms).");
      }
    }
    // Every tensor: required by the pattern (must be set) or unused (an output must then be null).
    const std::size_t quant_bytes = nvfp4 ? rows * hidden / 2 : rows * hidden;
    const Tensor tensors[] = {
        {"in", a.in, act, 16, false},
        {"out", a.out, act, 16, true},
        {"residual_in", a.residual_in, act, 16, false},
        {"residual_out", a.residual_out, act, 16, true},
        {"gamma", a.gamma, hidden * sizeof(T), 16, false},
        {"norm_out", a.norm_out, act, 16, true},
        {"quant_out", a.quant_out, quant_bytes, 16, true},
        {"scale", a.scale, sizeof(float), alignof(float), false},
        {"scale_out", a.scale_out, rows * sizeof(float), alignof(float), true},
        {"block_scale_out", a.block_scale_out, algo::nvfp4_scale_bytes(a.num_tokens, cfg_.hidden_dim, a.layout), 1, true},
    };
    auto used = [&](std::string_view name) -> int {  // 2 required, 1 optional, 0 unused
      if (name == "in") return 2;
      if (name == "out") return P == Pattern::AllReduce ? 2 : 0;
      if (name == "residual_in" || name == "residual_out" || name == "gamma") return norm ? 2 : 0;
      if (name == "norm_out") return P == Pattern::ResidualRmsNorm ? 2 : (norm ? 1 : 0);
      if (name == "quant_out") return fp8 || nvfp4 ? 2 : 0;
      if (name == "scale") return P == Pattern::ResidualRmsNormFp8 || nvfp4 ? 2 : 0;
      if (name == "scale_out") return P == Pattern::ResidualRmsNormFp8Dynamic ? 2 : 0;
      return nvfp4 ? 2 : 0;  // block_scale_out
    };
    for (const Tensor& t : tensors) {
      const int u = used(t.name);
      if (u == 2 && t.ptr == nullptr) {
        throw std::invalid_argument(where + t.name + " is a null pointer; " + to_string(P) + " needs it. Fix: pass it.");
      }
      if (u == 0 && t.output && t.ptr != nullptr) {
        throw std::invalid_argument(where + t.name + " = " + pointer_text(t.ptr) + " is set, but " + to_string(P) +
                                    " does not write it. Fix: pass nullptr, or the pattern that produces it.");
      }
      if (u == 0 || t.ptr == nullptr) continue;
      if (reinterpret_cast<std::uintptr_t>(t.ptr) % t.align != 0) {
        throw std::invalid_argument(where + t.name + " = " + pointer_text(t.ptr) + " is not " + std::to_string(t.align) +
                                    "-byte aligned. Fix: allocate with cudaMalloc or align the tensor to " +
                                    std::to_string(t.align) + " bytes.");
      }
      platform_.check_pointer(t.ptr, t.name);
    }
    // Outputs must not overlap anything, except the aliases inference engines rely on.
    auto allowed_alias = [](std::string_view x, std::string_view y) {
      auto pair = [&](std::string_view a, std::string_view b) { return (x == a && y == b) || (x == b && y == a); };
      return pair("out", "in") || pair("norm_out", "in") || pair("residual_out", "residual_in");
    };
    for (const Tensor& x : tensors) {
      if (!x.output || x.ptr == nullptr || used(x.name) == 0) continue;
      for (const Tensor& y : tensors) {
        if (&x == &y || y.ptr == nullptr || used(y.name) == 0 || (y.output && &y < &x)) continue;
        const auto a0 = reinterpret_cast<std::uintptr_t>(x.ptr);
        const auto b0 = reinterpret_cast<std::uintptr_t>(y.ptr);
        if (!(a0 < b0 + y.bytes && b0 < a0 + x.bytes)) continue;
        if (a0 == b0 && x.bytes == y.bytes && allowed_alias(x.name, y.name)) continue;
        throw std::invalid_argument(where + x.name + " (" + pointer_text(x.ptr) + ", " + std::to_string(x.bytes) +
                                    " bytes) overlaps " + y.name + " (" + pointer_text(y.ptr) + ", " +
                                    std::to_string(y.bytes) +
                                    " bytes). Allowed: out == in, norm_out == in, residual_out == residual_in, "
                                    "exactly. Fix: pass disjoint buffers or one of those aliases.");
      }
    }
  }

  static std::string pointer_text(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", p);
    return buf;
  }

  void check_if_synchronous() const {
    if constexpr (requires { Platform::synchronous; }) {
      if constexpr (Platform::synchronous) check();
    }
  }

  Platform platform_;
  Topology topo_;
  WorkspaceConfig cfg_;
  std::size_t buffer_words_ = 0;
  std::vector<std::uint32_t*> buffers_;
  algo::LamportState* state_ = nullptr;
  algo::ErrorRecord* error_ = nullptr;
  Strategy last_strategy_ = Strategy::Auto;
};

}  // namespace fiar::inline v0_1
