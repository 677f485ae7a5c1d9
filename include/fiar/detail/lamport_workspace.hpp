// fiar/detail/lamport_workspace.hpp — what the trtllm and mnnvl workspaces share: sizing, the strategy
// table, collective creation, validation and the launch of the Lamport protocols (algo/lamport.hpp).
// Contract: creation is collective and verified (every rank agrees on the configuration or every rank
// throws the same error); each call is validated before anything is launched; a kernel that waited past
// the deadline makes this and every later call throw fiar::timeout_error until the workspace is recreated.
// The backends differ only in how the region is mapped (peer mappings, or a multicast object as well) and
// in the transport of the kernels; Policy selects both.
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

#include "../algo/lamport.hpp"
#include "../bootstrap.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../policy.hpp"
#include "../resolve.hpp"
#include "../topology.hpp"
#include "../version.hpp"
#include "../workspace.hpp"
#include "validate.hpp"

namespace fiar::inline v0_1 {

/// The built-in strategy table of the trtllm backend: per-rank message bytes (tokens x hidden x sizeof(T))
/// up to which one-shot is faster, by architecture and world size. Anchored on the per-GPU tables inference
/// engines measured for this protocol pair (H100 / B200); replace it with WorkspaceConfig::oneshot_max_bytes
/// after measuring with the benchmark.
constexpr std::size_t default_oneshot_max_bytes(int arch, int world_size) {
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  const bool blackwell = arch >= 100;
  if (world_size <= 2) return 32 * MiB;
  if (world_size <= 4) return blackwell ? 4 * MiB : 2 * MiB;
  if (world_size <= 8) return blackwell ? 1 * MiB : 512 * KiB;
  return blackwell ? 512 * KiB : 256 * KiB;
}

/// The built-in table of a backend. mnnvl: one-shot while the bytes every rank receives (W x the message)
/// stay within 1 MiB, the threshold FlashInfer measured for multicast one-shot; trtllm: the table above.
constexpr std::size_t default_oneshot_max_bytes(Backend backend, int arch, int world_size) {
  if (backend == Backend::Mnnvl) return (std::size_t{1} << 20) / static_cast<std::size_t>(world_size < 1 ? 1 : world_size);
  return default_oneshot_max_bytes(arch, world_size);
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

inline std::string rank_mask_text(std::uint64_t mask) {
  std::string s;
  for (int r = 0; r < 64; ++r) {
    if (mask & (std::uint64_t{1} << r)) s += (s.empty() ? "" : ", ") + std::to_string(r);
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

// This rank's view of a workspace, as agree_on_creation compares it: what every backend fills alike (the
// one-shot threshold and buffer_words are the backend's to add).
template <ReduceType T>
CreationRecord creation_record(Backend backend, const Topology& topo, const WorkspaceConfig& cfg) {
  CreationRecord r{};
  r.backend = static_cast<std::uint32_t>(backend);
  r.dtype_bytes = sizeof(T);
  r.dtype_is_bf16 = std::is_same_v<T, __nv_bfloat16> ? 1 : 0;
  r.world_size = static_cast<std::uint32_t>(topo.world_size);
  r.max_token_num = static_cast<std::uint32_t>(cfg.max_token_num);
  r.hidden_dim = static_cast<std::uint32_t>(cfg.hidden_dim);
  r.version_major = version_major;
  r.version_minor = version_minor;
  r.version_patch = version_patch;
  r.timeout_ms = static_cast<std::uint32_t>(cfg.timeout.count());
  r.oneshot_at_max_tokens = cfg.oneshot_at_max_tokens ? 1 : 0;
  return r;
}

// The fused epilogue's parameters of a call.
template <ReduceType T>
algo::EpilogueParams<T> epilogue_params(const FusedArgs<T>& a) {
  return algo::EpilogueParams<T>{a.residual_in,
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
}

/// The Lamport workspace of Policy (TrtllmPolicy or MnnvlPolicy); Workspace<Policy, T, Platform> derives
/// from it and adds nothing.
template <class Policy, ReduceType T, class Platform>
class LamportWorkspace {
  static constexpr bool kMulticast = Policy::needs_multicast;
  static constexpr algo::Transport kTransport = kMulticast ? algo::Transport::Multicast : algo::Transport::Unicast;
  static constexpr std::string_view kName = to_string(Policy::backend);

 public:
  using policy_type = Policy;
  using value_type = T;
  using platform_type = Platform;

  /// Words of one Lamport buffer for this configuration (one of three; a call uses one).
  static std::size_t buffer_words(int world_size, int arch, const WorkspaceConfig& cfg) {
    const int vecs = vecs_per_token(cfg.hidden_dim);
    const std::size_t threshold =
        cfg.oneshot_max_bytes.value_or(default_oneshot_max_bytes(Policy::backend, arch, world_size));
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
    return why_not_text<Policy>(topo, [&] { return config_error(topo, cfg); });
  }
  static bool can_implement(const Topology& topo, const WorkspaceConfig& cfg) {
    return implementable(topo, [&] { return why_not(topo, cfg); });
  }

  /// Collective: every rank of the group constructs its workspace with the same topology (bar rank) and
  /// configuration. Throws std::invalid_argument (on every rank alike) when the topology or configuration
  /// cannot work, before allocating anything; fiar::timeout_error when a rank does not arrive.
  template <Bootstrap B>
  LamportWorkspace(B& boot, const Topology& topo, const WorkspaceConfig& cfg,
                   const typename Platform::Options& options = typename Platform::Options{})
      : platform_(options), topo_(topo), cfg_(cfg) {
    const std::string error = local_creation_error<Policy>(topo, boot, [&] { return config_error(topo, cfg); });
    detail::CreationRecord mine = creation_record<T>(Policy::backend, topo, cfg);
    mine.oneshot_max_bytes = oneshot_threshold();
    mine.buffer_words = error.empty() ? buffer_words(topo.world_size, topo.arch, cfg) : 0;
    detail::agree_on_creation(boot, mine, error);

    buffer_words_ = mine.buffer_words;
    const std::size_t region_words = algo::kLamportBuffers * buffer_words_;
    if constexpr (kMulticast) {
      // Peer mappings for the two-shot scatter, plus the group's multicast mapping of the same memory. A
      // failure here (no multicast on this machine after all) throws fiar::multicast_error on every rank.
      auto region = platform_.allocate_multicast(boot, region_words * sizeof(std::uint32_t));
      buffers_ = std::move(region.peers);
      multicast_ = region.view;
    } else {
      buffers_ = platform_.allocate_shared(boot, region_words * sizeof(std::uint32_t));
    }
    state_ = static_cast<algo::LamportState*>(platform_.allocate_local(sizeof(algo::LamportState)));
    error_ = static_cast<algo::ErrorRecord*>(platform_.allocate_host_visible(sizeof(algo::ErrorRecord)));
    platform_.fill_words(buffers_[static_cast<std::size_t>(topo.rank)], region_words, detail::kSentinelWord);
    platform_.synchronize();
    boot.barrier();  // no rank pushes into a buffer before its owner has filled it with sentinels
  }

  LamportWorkspace(LamportWorkspace&& other) noexcept
      : platform_(std::move(other.platform_)),
        topo_(other.topo_),
        cfg_(other.cfg_),
        buffer_words_(other.buffer_words_),
        buffers_(std::move(other.buffers_)),
        multicast_(std::exchange(other.multicast_, algo::MulticastView{})),
        state_(std::exchange(other.state_, nullptr)),
        error_(std::exchange(other.error_, nullptr)),
        last_strategy_(other.last_strategy_) {}
  LamportWorkspace& operator=(LamportWorkspace&& other) noexcept {
    if (this != &other) {
      platform_ = std::move(other.platform_);
      topo_ = other.topo_;
      cfg_ = other.cfg_;
      buffer_words_ = other.buffer_words_;
      buffers_ = std::move(other.buffers_);
      multicast_ = std::exchange(other.multicast_, algo::MulticastView{});
      state_ = std::exchange(other.state_, nullptr);
      error_ = std::exchange(other.error_, nullptr);
      last_strategy_ = other.last_strategy_;
    }
    return *this;
  }
  LamportWorkspace(const LamportWorkspace&) = delete;
  LamportWorkspace& operator=(const LamportWorkspace&) = delete;
  ~LamportWorkspace() = default;

  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const WorkspaceConfig& config() const { return cfg_; }
  [[nodiscard]] Platform& platform() { return platform_; }
  [[nodiscard]] std::size_t oneshot_threshold() const {
    return cfg_.oneshot_max_bytes.value_or(default_oneshot_max_bytes(Policy::backend, topo_.arch, topo_.world_size));
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
    validate_fused<P, T>(a, cfg_.hidden_dim, arch(), topo_.rank, platform_);
    const Strategy s = strategy == Strategy::Auto ? strategy_for(a.num_tokens) : strategy;
    algo::LamportParams<T> p{};
    p.in = a.in;
    p.out = a.out;
    p.num_tokens = a.num_tokens;
    p.vecs_per_token = vecs_per_token(cfg_.hidden_dim);
    p.world_size = topo_.world_size;
    p.rank = topo_.rank;
    for (int r = 0; r < topo_.world_size; ++r) p.buffers[r] = buffers_[static_cast<std::size_t>(r)];
    p.multicast = multicast_;
    p.buffer_words = buffer_words_;
    p.state = state_;
    p.error = error_;
    p.timeout_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.timeout).count());
    p.epi = epilogue_params(a);
    platform_.template launch<P, T, kTransport>(s, p, stream);
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
    auto mask = [](const std::uint32_t* words) {
      return std::uint64_t{Platform::read_word(words)} | (std::uint64_t{Platform::read_word(words + 1)} << 32);
    };
    const std::uint64_t missing = mask(error_->missing);
    const std::uint64_t stalled = mask(error_->stalled);
    std::string waited = missing != 0 ? "waiting for data from rank(s) " + detail::rank_mask_text(missing)
                                      : "waiting for results reduced by rank(s) " + detail::rank_mask_text(stalled) +
                                            " (two-shot owners: one of them, or a rank they wait for, is missing)";
    throw timeout_error("fiar: " + std::string(kName) + " all-reduce on rank " + std::to_string(topo_.rank) + " gave up after " +
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
    if (std::string e = common_config_error<T>(cfg); !e.empty()) return e;
    const std::size_t words = buffer_words(topo.world_size, topo.arch, cfg);
    if (words > std::numeric_limits<std::uint32_t>::max()) {
      return "fiar: the " + std::string(kName) + " workspace for max_token_num " + std::to_string(cfg.max_token_num) + ", hidden_dim " +
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
    const std::string where = call_where(pattern, topo_.rank);
    validate_call_basics(where, pattern, in, out, num_tokens, cfg_.max_token_num);
    if (strategy != Strategy::Auto && !is_buffer_size_sufficient(num_tokens, strategy)) {
      throw std::invalid_argument(where + std::string(to_string(strategy)) + " with num_tokens = " +
                                  std::to_string(num_tokens) + " needs " +
                                  std::to_string(words_for(strategy, num_tokens) * 4) +
                                  " bytes per Lamport buffer; this workspace has " + std::to_string(buffer_words_ * 4) +
                                  ". Fix: use Strategy::Auto, or create the workspace with oneshot_at_max_tokens.");
    }
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
  algo::MulticastView multicast_{};
  algo::LamportState* state_ = nullptr;
  algo::ErrorRecord* error_ = nullptr;
  Strategy last_strategy_ = Strategy::Auto;
};

}  // namespace detail
}  // namespace fiar::inline v0_1
