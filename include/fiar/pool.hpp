// fiar/pool.hpp — WorkspacePool: the workspaces of one group, shared between purposes where they can be.
// Contract: acquire() is collective (every rank calls it with the same purpose, type and config, in the same
// order; a mismatch throws std::invalid_argument on every rank instead of hanging). It hands back an existing
// workspace when its backend, element type and capacity serve the request, and creates one with
// make_workspace() otherwise. The pool owns every workspace and destroys each exactly once (clear() or the
// destructor), however many purposes share it. Purposes sharing a workspace must issue their calls in one
// order on every rank (one stream, or ordered streams): a workspace runs one collective at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "any_workspace.hpp"
#include "backend.hpp"
#include "bootstrap.hpp"
#include "dtype.hpp"
#include "topology.hpp"
#include "version.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

/// A Bootstrap held by reference behind a fixed type (the pool keeps one; the bootstrap must outlive it).
class BootstrapRef {
 public:
  template <Bootstrap B>
    requires(!std::is_same_v<std::remove_cvref_t<B>, BootstrapRef>)
  explicit BootstrapRef(B& boot)
      : rank_([&boot] { return boot.rank(); }),
        size_([&boot] { return boot.size(); }),
        all_gather_([&boot](std::span<const std::byte> in, std::span<std::byte> out) { boot.all_gather(in, out); }),
        barrier_([&boot] { boot.barrier(); }) {}

  [[nodiscard]] int rank() const { return rank_(); }
  [[nodiscard]] int size() const { return size_(); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) { all_gather_(in, out); }
  void barrier() { barrier_(); }

 private:
  std::function<int()> rank_, size_;
  std::function<void(std::span<const std::byte>, std::span<std::byte>)> all_gather_;
  std::function<void()> barrier_;
};

/// Whether a workspace created with `have` can serve calls sized by `want` (same element type and backend
/// assumed): the same hidden size, timeout and strategy threshold, at least as many tokens, and one-shot
/// at max_token_num if `want` asks for it.
constexpr bool config_can_serve(const WorkspaceConfig& have, const WorkspaceConfig& want) {
  return have.hidden_dim == want.hidden_dim && have.timeout == want.timeout &&
         have.oneshot_max_bytes == want.oneshot_max_bytes && have.max_token_num >= want.max_token_num &&
         (have.oneshot_at_max_tokens || !want.oneshot_at_max_tokens);
}

/// The workspaces of one group (one per distinct need), for several purposes (e.g. the plain all-reduce
/// and the quantized fused patterns of a model, or a target and a draft model).
template <class Platform = CudaPlatform>
class WorkspacePool {
 public:
  /// `boot` and `topology` describe the group; the bootstrap must outlive the pool. `requested` is the
  /// default backend of acquire().
  template <Bootstrap B>
  WorkspacePool(B& boot, const Topology& topology, Backend requested = backend_from_env(),
                const typename Platform::Options& options = typename Platform::Options{})
      : boot_(boot), topology_(topology), requested_(requested), options_(options) {}

  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;
  ~WorkspacePool() { clear(); }

  /// Collective: the workspace for `purpose`, shared with an earlier one when it can serve `config` with
  /// the same element type and backend request, else a new one (make_workspace). The reference stays valid
  /// until clear() or the pool's destruction.
  template <ReduceType T>
  AnyWorkspace<T, Platform>& acquire(std::string_view purpose, const WorkspaceConfig& config) {
    return acquire<T>(purpose, config, requested_);
  }
  template <ReduceType T>
  AnyWorkspace<T, Platform>& acquire(std::string_view purpose, const WorkspaceConfig& config, Backend requested) {
    agree_on_request(purpose, dtype_code<T>(), config, requested);
    for (auto& e : entries_) {
      const bool same_backend = e->requested == requested || e->backend == requested;
      if (e->dtype == dtype_code<T>() && same_backend && config_can_serve(e->config, config)) {
        e->purposes.emplace_back(purpose);
        return *static_cast<AnyWorkspace<T, Platform>*>(e->workspace.get());
      }
    }
    auto* ws = new AnyWorkspace<T, Platform>(make_workspace<T, Platform>(boot_, topology_, config, requested, options_));
    auto entry = std::make_unique<Entry>();
    entry->dtype = dtype_code<T>();
    entry->requested = requested;
    entry->backend = ws->backend();
    entry->config = config;
    entry->purposes.emplace_back(purpose);
    entry->workspace = Owned(ws, [](void* p) { delete static_cast<AnyWorkspace<T, Platform>*>(p); });
    entries_.push_back(std::move(entry));
    return *ws;
  }

  /// Distinct workspaces held.
  [[nodiscard]] std::size_t size() const { return entries_.size(); }
  /// The purposes served by the workspace that serves `purpose` (empty when none does).
  [[nodiscard]] std::vector<std::string> sharing_with(std::string_view purpose) const {
    for (const auto& e : entries_) {
      for (const auto& p : e->purposes) {
        if (p == purpose) return e->purposes;
      }
    }
    return {};
  }
  /// Destroys every workspace once, newest first. Call it on every rank after the last call has finished
  /// everywhere (synchronize the streams, then a barrier), as for any workspace.
  void clear() {
    while (!entries_.empty()) entries_.pop_back();
  }

 private:
  using Owned = std::unique_ptr<void, void (*)(void*)>;
  struct Entry {
    std::uint32_t dtype = 0;
    Backend requested = Backend::Auto;  // what the purpose that created it asked for
    Backend backend = Backend::Auto;    // what runs
    WorkspaceConfig config;
    std::vector<std::string> purposes;
    Owned workspace{nullptr, [](void*) {}};
  };

  template <ReduceType T>
  static constexpr std::uint32_t dtype_code() {
    if constexpr (std::is_same_v<T, float>) return 0;
    else if constexpr (std::is_same_v<T, __half>) return 1;
    else return 2;
  }
  static std::string_view dtype_text(std::uint32_t code) { return code == 0 ? "float" : code == 1 ? "half" : "bf16"; }

  // Every rank must ask for the same thing in the same order, or ranks would disagree about creating a
  // workspace (a collective) and hang: compare before deciding.
  void agree_on_request(std::string_view purpose, std::uint32_t dtype, const WorkspaceConfig& c, Backend requested) {
    struct Request {
      std::uint64_t purpose_hash, oneshot_max_bytes;
      std::int64_t timeout_ms;
      std::uint32_t dtype, requested, max_token_num, hidden_dim, oneshot_at_max_tokens, has_threshold;
    };
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a
    for (unsigned char ch : purpose) h = (h ^ ch) * 1099511628211ull;
    const Request mine{h,
                       c.oneshot_max_bytes.value_or(0),
                       static_cast<std::int64_t>(c.timeout.count()),
                       dtype,
                       static_cast<std::uint32_t>(requested),
                       static_cast<std::uint32_t>(c.max_token_num),
                       static_cast<std::uint32_t>(c.hidden_dim),
                       c.oneshot_at_max_tokens ? 1u : 0u,
                       c.oneshot_max_bytes ? 1u : 0u};
    const auto all = all_gather_value(boot_, mine);
    for (std::size_t r = 1; r < all.size(); ++r) {
      const Request& a = all[0];
      const Request& b = all[r];
      if (a.purpose_hash != b.purpose_hash || a.dtype != b.dtype || a.requested != b.requested ||
          a.max_token_num != b.max_token_num || a.hidden_dim != b.hidden_dim || a.timeout_ms != b.timeout_ms ||
          a.oneshot_at_max_tokens != b.oneshot_at_max_tokens || a.has_threshold != b.has_threshold ||
          a.oneshot_max_bytes != b.oneshot_max_bytes) {
        auto text = [](const Request& q) {
          return std::string(dtype_text(q.dtype)) + ", backend " +
                 std::string(to_string(static_cast<Backend>(q.requested))) + ", max_token_num " +
                 std::to_string(q.max_token_num) + ", hidden_dim " + std::to_string(q.hidden_dim) + ", timeout " +
                 std::to_string(q.timeout_ms) + " ms, oneshot_max_bytes " +
                 (q.has_threshold ? std::to_string(q.oneshot_max_bytes) : std::string("default")) +
                 ", oneshot_at_max_tokens " + (q.oneshot_at_max_tokens ? "true" : "false") + ", purpose hash " +
                 std::to_string(q.purpose_hash);
        };
        throw std::invalid_argument(
            "fiar: WorkspacePool::acquire(\"" + std::string(purpose) + "\") on rank " + std::to_string(boot_.rank()) +
            ": ranks asked for different workspaces: rank 0 {" + text(a) + "}, rank " + std::to_string(r) + " {" +
            text(b) + "}. Fix: acquire the same purposes with the same type and WorkspaceConfig, in the same order, "
            "on every rank.");
      }
    }
  }

  BootstrapRef boot_;
  Topology topology_;
  Backend requested_;
  typename Platform::Options options_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

}  // namespace fiar::inline v0_1
