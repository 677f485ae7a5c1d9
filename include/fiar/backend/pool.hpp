// SPDX-License-Identifier: Apache-2.0
// fiar/backend/pool.hpp — WorkspacePool: the workspaces of one group, shared between purposes where they can be.
// Contract: acquire() is collective (every rank calls it with the same purpose, type and config, in the same order; a
// mismatch, or a rank-local mistake such as a bad FIAR_ALLREDUCE_BACKEND, throws std::invalid_argument on every rank
// instead of hanging). It hands back an existing workspace when its backend, element type and capacity serve the
// request, and creates one with make_workspace() otherwise. The pool owns every workspace and destroys each exactly
// once (clear() or the destructor), however many purposes share it. Purposes sharing a workspace must issue their
// calls in one order on every rank (one stream, or ordered streams): a workspace runs one collective at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../platform/concept.hpp"
#include "any.hpp"
#include "workspace.hpp"

FIAR_BEGIN_NAMESPACE

/// Whether a workspace created with `have` can serve calls sized by `want` (same element type and backend assumed):
/// the same hidden size, timeout, strategy thresholds and call verification, at least as many tokens, and one-shot at
/// max_token_num if `want` asks for it.
constexpr bool config_can_serve(const WorkspaceConfig& have, const WorkspaceConfig& want) {
  return have.hidden_dim == want.hidden_dim && have.timeout == want.timeout &&
         have.oneshot_max_bytes == want.oneshot_max_bytes && have.max_token_num >= want.max_token_num &&
         (have.oneshot_at_max_tokens || !want.oneshot_at_max_tokens) && have.verify_calls == want.verify_calls &&
         have.multimem_min_bytes == want.multimem_min_bytes && have.nccl_min_bytes == want.nccl_min_bytes &&
         have.nccl_symmetric_max_bytes == want.nccl_symmetric_max_bytes && have.batch_invariant == want.batch_invariant;
}

/// The workspaces of one group (one per distinct need), for several purposes (e.g. the plain all-reduce and the
/// quantized fused patterns of a model, or a target and a draft model).
template <Platform Pf = CudaPlatform>
class WorkspacePool {
 public:
  /// `boot` and `topology` describe the group; the bootstrap must outlive the pool. acquire() without a backend
  /// reads FIAR_ALLREDUCE_BACKEND (on every rank, collectively).
  template <Bootstrap B>
  WorkspacePool(B& boot, const Topology& topology) : boot_(boot), topology_(topology) {}
  /// As above, with `requested` as the default backend of acquire() and the platform's options.
  template <Bootstrap B>
  WorkspacePool(B& boot, const Topology& topology, Backend requested,
                const typename Pf::Options& options = typename Pf::Options{})
      : boot_(boot), topology_(topology), requested_(requested), options_(options) {}

  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;
  ~WorkspacePool() { clear(); }

  /// Collective: the workspace for `purpose`, shared with an earlier one when it can serve `config` with the same
  /// element type and backend request, else a new one (make_workspace). The reference stays valid until clear() or
  /// the pool's destruction.
  template <ReduceType T>
  AnyWorkspace<T, Pf>& acquire(std::string_view purpose, const WorkspaceConfig& config) {
    return acquire_as<T>(purpose, config, requested_);
  }
  template <ReduceType T>
  AnyWorkspace<T, Pf>& acquire(std::string_view purpose, const WorkspaceConfig& config, Backend requested) {
    return acquire_as<T>(purpose, config, requested);
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
  /// Destroys every workspace once, newest first. Call it on every rank after the last call has finished everywhere
  /// (synchronize the streams, then a barrier), as for any workspace.
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

  // What every rank compares before deciding to share or create.
  struct Request {
    std::uint64_t purpose_hash;
    detail::ConfigDigest config;
    std::uint32_t dtype;
    std::int32_t requested;
    [[nodiscard]] std::string describe() const {
      return std::string(dtype_name(dtype)) + ", backend " + std::string(to_string(static_cast<Backend>(requested))) +
             ", " + config.describe() + ", purpose hash " + std::to_string(purpose_hash);
    }
    friend bool operator==(const Request&, const Request&) = default;
  };

  template <ReduceType T>
  AnyWorkspace<T, Pf>& acquire_as(std::string_view purpose, const WorkspaceConfig& config,
                                  std::optional<Backend> given) {
    const Backend requested = agree_on_request(purpose, dtype_code<T>(), config, given);
    for (auto& e : entries_) {
      const bool same_backend = e->requested == requested || e->backend == requested;
      if (e->dtype == dtype_code<T>() && same_backend && config_can_serve(e->config, config)) {
        e->purposes.emplace_back(purpose);
        return *static_cast<AnyWorkspace<T, Pf>*>(e->workspace.get());
      }
    }
    auto* ws = new AnyWorkspace<T, Pf>(make_workspace<T, Pf>(boot_, topology_, config, requested, options_));
    auto entry = std::make_unique<Entry>();
    entry->workspace = Owned(ws, [](void* p) { delete static_cast<AnyWorkspace<T, Pf>*>(p); });
    entry->dtype = dtype_code<T>();
    entry->requested = requested;
    entry->backend = ws->backend();
    entry->config = config;
    entry->purposes.emplace_back(purpose);
    entries_.push_back(std::move(entry));
    return *ws;
  }

  // Every rank must acquire the same purposes with the same type and configuration in the same order, or ranks would
  // disagree about creating a workspace (a collective) and hang: compare before deciding. Returns the request.
  Backend agree_on_request(std::string_view purpose, std::uint32_t dtype, const WorkspaceConfig& c,
                           std::optional<Backend> given) {
    Request mine{detail::fnv1a(purpose), detail::ConfigDigest::of(c), dtype, 0};
    const detail::StepOutcome local = detail::attempt([&] {
      const Backend b = given ? *given : backend_from_env();
      check_backend(b);
      mine.requested = static_cast<std::int32_t>(b);
    });
    const auto all = detail::agree(boot_, local, mine, "WorkspacePool::acquire failed on rank {rank}");
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (!(all[r] == all[0])) {
        throw std::invalid_argument("fiar: WorkspacePool::acquire(\"" + std::string(purpose) + "\") on rank " +
                                    std::to_string(boot_.rank()) + ": ranks asked for different workspaces: rank 0 {" +
                                    all[0].describe() + "}, rank " + std::to_string(r) + " {" + all[r].describe() +
                                    "}. Fix: acquire the same purposes with the same type and WorkspaceConfig, in the "
                                    "same order, on every rank.");
      }
    }
    return static_cast<Backend>(mine.requested);
  }

  BootstrapRef boot_;
  Topology topology_;
  std::optional<Backend> requested_;  ///< acquire()'s default; none: FIAR_ALLREDUCE_BACKEND
  typename Pf::Options options_{};
  std::vector<std::unique_ptr<Entry>> entries_;
};

FIAR_END_NAMESPACE
