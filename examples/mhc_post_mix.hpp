// SPDX-License-Identifier: Apache-2.0
// A user epilogue (examples/05_user_epilogue.cpp): DeepSeek-V4's manifold-constrained hyper-connections (mHC), the
// post-mixing after a tensor-parallel layer, fused with its all-reduce. The layer's output x = the all-reduce's sum
// [T, H] is mixed back into the 4 residual streams:
//
//   out[t, j, :] = T(post_mix[t, j] x x[t, :] + sum over i of comb_mix[t, i, j] x residual[t, i, :])
//
// in fp32: acc = post_mix[t, j] x f(x), then acc = fma(comb_mix[t, i, j], f(residual[t, i]), acc) for i = 0 .. 3,
// rounded once to T. A header of its own because two translation units need it: the program that calls
// Workspace::run<MhcPostMix> (plain C++) and the module's nvcc translation unit (examples/kernels.cu), where
// FIAR_INSTANTIATE_EPILOGUE(MhcPostMix, T) emits its kernels.
#pragma once

#include <fiar/fiar.hpp>

#include <string>

struct MhcPostMix {
  static constexpr const char* name = "mhc_post_mix";  // in messages, profiles and call digests
  static constexpr int kStreams = 4;                   // residual streams (the hyper-connection's expansion rate)

  // The user's tensors: trivially copyable, passed to every kernel by value.
  template <class T>
  struct Params {
    const T* residual;      // [num_tokens, 4, hidden_dim]: the streams before the layer
    const float* post_mix;  // [num_tokens, 4]: how much of the layer's output each stream takes
    const float* comb_mix;  // [num_tokens, 4, 4]: comb_mix[t][i][j] weighs stream i into output stream j
    T* out;                 // [num_tokens, 4, hidden_dim]: the streams after the layer (may be residual: a lane
                            // reads a vector's 4 streams before it writes them, and no other lane touches them)
  };

  // Once per reduced token, on every lane of the token's cluster; each lane mixes its own vectors of the token.
  template <class T, class Token>
  FIAR_HD static void finish(const Params<T>& p, Token& token) {
    using fiar::algo::fma_rn;
    using fiar::algo::to_float;
    const int t = token.token();
    float post[kStreams], comb[kStreams][kStreams];
    for (int j = 0; j < kStreams; ++j) post[j] = p.post_mix[t * kStreams + j];
    for (int i = 0; i < kStreams; ++i) {
      for (int j = 0; j < kStreams; ++j) comb[i][j] = p.comb_mix[(t * kStreams + i) * kStreams + j];
    }
    token.for_each_vec([&](int v) {
      const auto x = token.sum(v);  // the all-reduce's sum, vector v of the token
      typename Token::vec_type r[kStreams];
      for (int i = 0; i < kStreams; ++i) r[i] = token.load(p.residual, t * kStreams + i, v);
      for (int j = 0; j < kStreams; ++j) {
        typename Token::vec_type o;
        for (int e = 0; e < Token::kElems; ++e) {
          float acc = post[j] * to_float(x.e[e]);
          for (int i = 0; i < kStreams; ++i) acc = fma_rn(comb[i][j], to_float(r[i].e[e]), acc);
          o.e[e] = fiar::algo::from_float<T>(acc);
        }
        token.store(p.out, t * kStreams + j, v, o);
      }
    });
  }

  // Checked on the host before anything is launched: "" or what is wrong, and how to fix it.
  template <class T>
  static std::string why_not(const Params<T>& p, int /*num_tokens*/, int /*hidden_dim*/) {
    if (p.residual == nullptr || p.post_mix == nullptr || p.comb_mix == nullptr || p.out == nullptr) {
      return "a null tensor in MhcPostMix::Params; it needs residual, post_mix, comb_mix and out. Fix: pass all four.";
    }
    return "";
  }
};
