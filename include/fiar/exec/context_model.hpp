// SPDX-License-Identifier: Apache-2.0
// fiar/exec/context_model.hpp — private: detail::ContextModel, a type that is an ExecutionContext and nothing more.
// Contract: declarations only (never defined, never called: it stands in unevaluated operands, where the Operation
// concept checks run(ctx, params)); it satisfies ExecutionContext, and a member added to the concept is added here too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/prelude.hpp"
#include "context.hpp"
#include "vec.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

// What Operation calls run() with: any execution context, without naming HostCtx, whose header (the emulator's
// threads, barriers and std::function) would otherwise be parsed by every nvcc translation unit of a kernel.
struct ContextModel {
  int lane();
  int lanes();
  int block();
  int blocks();
  void sync();
  bool sync_or(bool vote);
  void cluster_sync();
  void token_sum_add(int vec, float q);
  float token_sum(int vecs);
  void group_max_add(int vec, float x);
  void group_max_sync();
  float group_max(int vec, float x, int group_vecs);
  float sum(float x);
  float max(float x);
  int cluster_rank();
  int cluster_size();
  int cluster_index();
  int clusters();
  float cluster_sum(float x);
  float cluster_max(float x);
  std::uint64_t now_ns();
  void pause();
  exec::Vec16 load16(const std::uint32_t* p);
  void store16(std::uint32_t* p, const exec::Vec16& v);
  void store16_weak(std::uint32_t* p, const exec::Vec16& v);
  void multicast_store16(const exec::MulticastView& view, std::size_t offset, const exec::Vec16& v);
  exec::Vec16 multicast_ld_reduce16(const exec::MulticastView& view, std::size_t offset, exec::ReduceKind kind);
  void multicast_add_release(const exec::MulticastView& view, std::size_t offset, std::uint32_t value);
  void fence_multicast();
  std::uint32_t load_relaxed(const std::uint32_t* p);
  std::uint32_t load_acquire(const std::uint32_t* p);
  void store_relaxed(std::uint32_t* p, std::uint32_t v);
  void store_release(std::uint32_t* p, std::uint32_t v);
  std::uint32_t fetch_add_acq_rel(std::uint32_t* p, std::uint32_t v);
  std::uint32_t fetch_add_relaxed(std::uint32_t* p, std::uint32_t v);
  std::uint32_t fetch_or_relaxed(std::uint32_t* p, std::uint32_t v);
  void fence_system();
};

static_assert(
    exec::ExecutionContext<ContextModel>,
    "fiar::detail::ContextModel (exec/context_model.hpp) must declare every member ExecutionContext requires");

}  // namespace detail
FIAR_END_NAMESPACE
