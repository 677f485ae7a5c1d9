// SPDX-License-Identifier: Apache-2.0
// fiar/algo/user_epilogue.hpp — epilogues users write: the UserEpilogue concept, the view of one reduced token its
// finish() gets (EpilogueToken: the token's vectors, the cluster-wide sum and max, row access to the user's tensors),
// and the dispatch every protocol calls per token, to a pattern's epilogue or to a user's.
// Contract: a user epilogue runs where a pattern's does, on every backend and strategy and on both platforms; its
// finish() is called once per reduced token by every lane of the token's cluster; cluster_sum is the canonical token
// sum (exec::canonical_token_sum), so an epilogue that reduces only through it and cluster_max gets the same bits at
// any launch shape and in a batch of any size.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/pattern.hpp"
#include "../core/prelude.hpp"
#include "../exec/context.hpp"
#include "../exec/context_model.hpp"
#include "../exec/vec.hpp"
#include "convert.hpp"
#include "epilogue.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {

/// One reduced token as a user epilogue's finish() sees it, on the lane that runs it. The token's vectors (16 bytes,
/// kElemsPerVec<T> elements each) are spread over the lanes of one cluster: each lane handles for_each_vec's. Every
/// lane of the cluster gets the same token, and calls cluster_sum / cluster_max the same number of times (never
/// inside a branch on its vectors).
template <ReduceType T, class Ctx, class Fetch>
class EpilogueToken {
 public:
  static constexpr int kElems = kElemsPerVec<T>;  ///< elements per vector
  using vec_type = Elems<T>;                      ///< a vector as its elements (.e[0 .. kElems))

  FIAR_HD EpilogueToken(Ctx& ctx, Fetch& fetch, int token, int num_tokens, int vecs_per_token)
      : ctx_(ctx), fetch_(fetch), token_(token), num_tokens_(num_tokens), vecs_(vecs_per_token) {
    const exec::TokenSplit split = exec::token_split(ctx);
    first_ = split.first_vec;
    step_ = split.vec_step;
  }

  /// The token (row of the call) and the call's shape.
  [[nodiscard]] FIAR_HD int token() const { return token_; }
  [[nodiscard]] FIAR_HD int num_tokens() const { return num_tokens_; }
  [[nodiscard]] FIAR_HD int vecs_per_token() const { return vecs_; }
  [[nodiscard]] FIAR_HD int hidden_dim() const { return vecs_ * kElems; }

  /// f(v) for each of this lane's vectors v of the token (none, one, or several: first, first + step, ...).
  FIAR_EXEC_CHECK_DISABLE
  template <class F>
  FIAR_HD void for_each_vec(F&& f) const {
    FIAR_NO_UNROLL
    for (int v = first_; v < vecs_; v += step_) f(v);
  }

  /// The all-reduce's sum of vector v of the token (this lane's vectors only). A second call for the same vector
  /// reads it again (the same bits, another wait on the Lamport buffer or another load).
  FIAR_HD Elems<T> sum(int v) {
    const int i = (v - first_) / step_;
    if (i >= 0 && i < 64) fetched_ |= std::uint64_t{1} << i;
    return detail::unpack<T>(fetch_(v));
  }

  /// Called by the protocol after finish(): fetches (waits for) this lane's vectors that finish() did not read, so
  /// that no peer's store into this call's buffer is still on its way when a later call clears the buffer (a late
  /// store landing after the clear would be read three calls later as that call's data). The lane's first 64 vectors
  /// are tracked; any further ones are fetched again either way (one load each once their data is there).
  FIAR_HD void drain() {
    int i = 0;
    FIAR_NO_UNROLL
    for (int v = first_; v < vecs_; v += step_, ++i) {
      if (i >= 64 || ((fetched_ >> i) & 1u) == 0) (void)fetch_(v);
    }
  }

  /// Vector v of row `row` of a row-major tensor of hidden_dim elements per row (a call's tensors are far below 2^32
  /// vectors: 32-bit index).
  [[nodiscard]] FIAR_HD Elems<T> load(const T* tensor, int row, int v) const {
    return detail::unpack<T>(detail::load_row(tensor, row, vecs_, v));
  }
  FIAR_HD void store(T* tensor, int row, int v, const Elems<T>& x) const {
    detail::store_row(tensor, row, vecs_, v, detail::repack<T>(x));
  }

  /// The sum over the token's vectors of f(v) (a float per vector, f called for this lane's vectors only) in the
  /// canonical order: the same bits on every lane, at every launch shape, on both platforms, in a batch of any size.
  /// Every lane of the cluster calls it.
  FIAR_EXEC_CHECK_DISABLE
  template <class F>
  FIAR_HD float cluster_sum(F&& f) {
    // Runs of kTokenSumChunk consecutive vectors (a warp on the GPU) walk the token together: every lane of a run
    // calls token_sum_add, with +0 past the last vector.
    const int sub = ctx_.lane() % exec::kTokenSumChunk;
    FIAR_NO_UNROLL
    for (int v0 = first_ - sub; v0 < vecs_; v0 += step_) {
      const int v = v0 + sub;
      ctx_.token_sum_add(v, v < vecs_ ? static_cast<float>(f(v)) : 0.0f);
    }
    return ctx_.token_sum(vecs_);
  }

  /// The largest of every lane's x over the token's cluster. Every lane of the cluster calls it.
  FIAR_HD float cluster_max(float x) { return ctx_.cluster_max(x); }

 private:
  Ctx& ctx_;
  Fetch& fetch_;
  int token_, num_tokens_, vecs_;
  int first_ = 0, step_ = 1;
  std::uint64_t fetched_ = 0;  ///< bit i: finish() read this lane's vector first + i x step
};

namespace detail {
// The fetch a model EpilogueToken holds (the concept's check; never called).
struct FetchModel {
  exec::Vec16 operator()(int v);
};
template <class T>
using TokenModel = EpilogueToken<T, ::fiar::detail::ContextModel, FetchModel>;
}  // namespace detail

/// An epilogue the user writes, for element type T:
///   struct MyEpilogue {
///     static constexpr const char* name = "my_epilogue";       // messages, profiles, the call digest
///     template <class T> struct Params { ... };                // trivially copyable: the user's tensors, scalars
///     template <class T, class Token>
///     FIAR_HD static void finish(const Params<T>& p, Token& token);  // per reduced token (EpilogueToken)
///     template <class T>                                       // optional, host: "" or what is wrong with a call
///     static std::string why_not(const Params<T>& p, int num_tokens, int hidden_dim);
///   };
/// Workspace::run<MyEpilogue>(in, num_tokens, params) runs it; FIAR_INSTANTIATE_EPILOGUE(MyEpilogue, T) in the
/// module's nvcc translation unit emits its kernels (<fiar/instantiate.cuh>).
template <class E, class T>
concept UserEpilogue =
    ReduceType<T> &&
    requires {
      { E::name } -> std::convertible_to<const char*>;
      typename E::template Params<T>;
    } && std::is_trivially_copyable_v<typename E::template Params<T>> &&
    requires(const typename E::template Params<T>& p, detail::TokenModel<T>& token) { E::finish(p, token); };

/// A user epilogue's call as its kernels get it: the call's EpilogueParams (in, num_tokens; the fused members unused)
/// and the user's Params.
template <class E, ReduceType T>
struct UserCallParams : EpilogueParams<T> {
  typename E::template Params<T> user;
};

namespace detail {
template <auto E, class T>
constexpr auto call_params_of() {
  if constexpr (is_pattern_v<E>) {
    return std::type_identity<EpilogueParams<T>>{};
  } else {
    return std::type_identity<UserCallParams<user_epilogue_t<E>, T>>{};
  }
}
}  // namespace detail

/// What a kernel with epilogue argument E (a Pattern, or user_epilogue<U>) gets of its call: EpilogueParams<T>, or
/// UserCallParams<U, T>.
template <auto E, ReduceType T>
using CallParams = typename decltype(detail::call_params_of<E, T>())::type;

/// Hands one reduced token to epilogue E: the pattern's (finish_token) or the user's finish(). `fetch(v)` returns
/// the token's reduced vector v (it may poll). Every lane of the token's cluster calls it.
FIAR_EXEC_CHECK_DISABLE
template <auto E, ReduceType T, class Ctx, class Fetch>
FIAR_HD void epilogue_token(Ctx& ctx, T* out, const CallParams<E, T>& e, int token, int vecs_per_token, Fetch&& fetch) {
  if constexpr (is_pattern_v<E>) {
    finish_token<E, T>(ctx, out, e, token, vecs_per_token, fetch);
  } else {
    EpilogueToken<T, Ctx, std::remove_reference_t<Fetch>> view(ctx, fetch, token, e.num_tokens, vecs_per_token);
    user_epilogue_t<E>::finish(e.user, view);
    view.drain();
  }
}

/// The call-wide outputs of epilogue E after its tokens (finish_call_outputs; none for a user epilogue).
FIAR_EXEC_CHECK_DISABLE
template <auto E, ReduceType T, class Ctx>
FIAR_HD void epilogue_call_outputs(Ctx& ctx, const CallParams<E, T>& e, int num_tokens, int hidden) {
  if constexpr (is_pattern_v<E>) finish_call_outputs<E, T>(ctx, e, num_tokens, hidden);
}

}  // namespace algo

/// The user epilogue concept and its token view, in fiar's namespace (what user code names).
template <class E, class T>
concept UserEpilogue = algo::UserEpilogue<E, T>;
using algo::EpilogueToken;

FIAR_END_NAMESPACE
