// SPDX-License-Identifier: Apache-2.0
// User epilogues (algo/user_epilogue.hpp) on the host emulator: example 05's mHC post-mixing and an epilogue that
// reduces through the token view's cluster_sum / cluster_max, on every backend, element type and strategy, against
// references written here; the sums' bits at every launch shape and batch position; the call checks and the digest
// that tells a user epilogue from another call.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../examples/mhc_post_mix.hpp"
#include "../common/cases.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"
#include "../common/text.hpp"

namespace {

using fiar::Strategy;
using fiar_test::as_float;
using namespace std::chrono_literals;
using fiar_test::bits;

// out = T(f(x) x s) with s = 1 / sqrt(ss / H + 1e-6), ss the token's sum of squares through cluster_sum (per vector
// left to right in fp32, fma); token_ss[t] = ss, token_max[t] = the largest |f(x)| through cluster_max. Reads each
// vector's sum three times (sum() again after the reductions).
struct RmsScale {
  static constexpr const char* name = "test_rms_scale";
  template <class T>
  struct Params {
    T* out;
    float* token_ss;
    float* token_max;
  };
  template <class T, class Token>
  FIAR_HD static void finish(const Params<T>& p, Token& token) {
    using fiar::algo::to_float;
    const float ss = token.cluster_sum([&](int v) {
      const auto x = token.sum(v);
      float q = 0.0f;
      for (int e = 0; e < Token::kElems; ++e) q = fiar::algo::fma_rn(to_float(x.e[e]), to_float(x.e[e]), q);
      return q;
    });
    float m = 0.0f;
    token.for_each_vec([&](int v) {
      const auto x = token.sum(v);
      for (int e = 0; e < Token::kElems; ++e) m = std::fmax(m, std::fabs(to_float(x.e[e])));
    });
    const float amax = token.cluster_max(m);
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(token.hidden_dim()) + 1e-6f);
    token.for_each_vec([&](int v) {
      const auto x = token.sum(v);
      typename Token::vec_type o;
      for (int e = 0; e < Token::kElems; ++e) o.e[e] = fiar::algo::from_float<T>(to_float(x.e[e]) * s);
      token.store(p.out, token.token(), v, o);
      if (v == 0) {
        p.token_ss[token.token()] = ss;
        p.token_max[token.token()] = amax;
      }
    });
  }
};

static_assert(fiar::UserEpilogue<MhcPostMix, __nv_bfloat16> && fiar::UserEpilogue<RmsScale, float>);
// No name, or Params not trivially copyable: not an epilogue.
struct Nameless {
  template <class T>
  struct Params {};
  template <class T, class Token>
  static void finish(const Params<T>&, Token&) {}
};
struct Heavy {
  static constexpr const char* name = "heavy";
  template <class T>
  struct Params {
    std::string text;
  };
  template <class T, class Token>
  static void finish(const Params<T>&, Token&) {}
};
static_assert(!fiar::UserEpilogue<Nameless, float> && !fiar::UserEpilogue<Heavy, float>);
static_assert(fiar::epilogue_code<fiar::user_epilogue<MhcPostMix>>() !=
              fiar::epilogue_code<fiar::user_epilogue<RmsScale>>());
static_assert((fiar::epilogue_code<fiar::user_epilogue<MhcPostMix>>() & 0xC0000000u) == fiar::kUserEpilogueCode);

// The canonical sum of per-vector values q (exec::canonical_token_sum, restated): chunks of 32 by butterfly, the
// chunk sums added into 32 partials in turn, a last butterfly.
float canonical_sum(const std::vector<float>& q) {
  auto butterfly = [](std::vector<float> x) {
    for (int m = 16; m > 0; m /= 2) {
      std::vector<float> y(32);
      for (int i = 0; i < 32; ++i)
        y[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] + x[static_cast<std::size_t>(i ^ m)];
      x = y;
    }
    return x[0];
  };
  std::vector<float> partial(32, 0.0f);
  const std::size_t chunks = (q.size() + 31) / 32;
  for (std::size_t j = 0; j < chunks; ++j) {
    std::vector<float> x(32, 0.0f);
    for (std::size_t i = 0; i < 32 && j * 32 + i < q.size(); ++i) x[i] = q[j * 32 + i];
    partial[j % 32] += butterfly(x);
  }
  return butterfly(partial);
}

// What one rank got from a user epilogue call.
template <class T>
struct UserOutputs {
  std::vector<T> out;
  std::vector<float> ss, amax;
};

// The inputs of rank r, call c ([tokens, hidden]; no special values: the mix of -0 and sentinels is the plain
// all-reduce's test).
template <class T>
std::vector<T> input_of(int tokens, int hidden, int rank, int call) {
  return fiar_test::make_input<T>(static_cast<std::size_t>(tokens) * hidden, rank, call, false);
}

// mHC's tensors for `tokens` tokens (the same on every rank, as the model has them).
template <class T>
struct MhcTensors {
  std::vector<T> residual;
  std::vector<float> post, comb;
  MhcTensors(int tokens, int hidden)
      : residual(fiar_test::make_input<T>(static_cast<std::size_t>(tokens) * 4 * hidden, 91, 3, false)),
        post(static_cast<std::size_t>(tokens) * 4),
        comb(static_cast<std::size_t>(tokens) * 16) {
    // Full fp32 mantissas (0.1 is not a binary fraction): every product rounds, so the order and the fma show.
    for (std::size_t i = 0; i < post.size(); ++i) post[i] = 0.3f + 0.1f * static_cast<float>(i % 5);
    for (std::size_t i = 0; i < comb.size(); ++i) comb[i] = 0.1f * static_cast<float>(static_cast<int>(i % 11) - 4);
  }
};

// The mHC reference: x the rank-order sum; per output stream j, post x f(x) then fma over the 4 residual streams.
template <class T>
std::vector<T> mhc_reference(const std::vector<T>& x, const MhcTensors<T>& m, int tokens, int hidden) {
  std::vector<T> out(static_cast<std::size_t>(tokens) * 4 * hidden);
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < hidden; ++h) {
        float acc = m.post[static_cast<std::size_t>(t * 4 + j)] * as_float(x[static_cast<std::size_t>(t) * hidden + h]);
        for (int i = 0; i < 4; ++i) {
          acc = std::fma(m.comb[static_cast<std::size_t>((t * 4 + i) * 4 + j)],
                         as_float(m.residual[(static_cast<std::size_t>(t) * 4 + i) * hidden + h]), acc);
        }
        out[(static_cast<std::size_t>(t) * 4 + j) * hidden + h] = fiar_test::from_float<T>(acc);
      }
    }
  }
  return out;
}

// The strategies a user epilogue runs with on the case's backend: the case's, the in-switch reduction on mnnvl, and
// the NCCL route of the Lamport backends.
template <class C>
std::vector<Strategy> user_strategies() {
  std::vector<Strategy> s = C::strategies();
  if constexpr (C::backend == fiar::Backend::Mnnvl) s.push_back(Strategy::Multimem);
  if constexpr (C::lamport) s.push_back(Strategy::Nccl);
  return s;
}

// Runs `calls` calls of E (make_params(rank, outputs) gives each rank's Params) on every rank with `strategy` and
// the grid `grid`; the inputs are input_of(..., call). Returns each rank's outputs after the last call.
template <class C, class E, class MakeParams>
std::vector<UserOutputs<typename C::value_type>> run_user(int world, int tokens, int hidden, Strategy strategy,
                                                          fiar::HostPlatformOptions grid, int calls,
                                                          MakeParams&& make_params) {
  using T = typename C::value_type;
  std::vector<UserOutputs<T>> result(static_cast<std::size_t>(world));
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  auto errors = fiar_test::run_ranks(world, [&](int r, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = tokens;
    cfg.hidden_dim = hidden;
    cfg.oneshot_at_max_tokens = true;
    if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = count * sizeof(T);
    typename C::workspace ws(boot, C::topology(world, r), cfg, grid);
    UserOutputs<T>& o = result[fiar_test::at(r)];
    for (int call = 0; call < calls; ++call) {
      const std::vector<T> in = input_of<T>(tokens, hidden, r, call);
      ws.template run<E>(in.data(), tokens, make_params(r, o), nullptr, strategy);
      ws.check();
    }
    FIAR_ENSURE(ws.last_strategy() == (C::lamport ? strategy : Strategy::Auto));
  });
  fiar_test::require_no_errors(errors);
  return result;
}

template <class T>
std::vector<T> sum_of_call(int world, int tokens, int hidden, int call) {
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(input_of<T>(tokens, hidden, r, call));
  return fiar_test::rank_order_sum(inputs, static_cast<std::size_t>(tokens) * hidden);
}

constexpr fiar::HostPlatformOptions kUserGrid{.blocks = 2, .lanes = 8, .cluster = 2};

}  // namespace

// mHC post-mixing (example 05) after the all-reduce: every rank's out bit for bit the reference's, on every strategy;
// two calls, so the second runs on rotated buffers. hidden of 45 or 90 vectors: lanes with two or more vectors and a
// partial last chunk.
FIAR_CASE_TEST("user epilogue: mHC post-mixing", "[epilogue]", fiar_test::Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 3, tokens = 5, hidden = 360;
  const MhcTensors<T> m(tokens, hidden);
  const std::vector<T> expected = mhc_reference(sum_of_call<T>(world, tokens, hidden, 1), m, tokens, hidden);
  for (const Strategy s : user_strategies<C>()) {
    CAPTURE(fiar::to_string(s));
    const auto outs = run_user<C, MhcPostMix>(world, tokens, hidden, s, kUserGrid, 2, [&](int, UserOutputs<T>& o) {
      o.out.assign(expected.size(), fiar_test::from_float<T>(0.0f));
      return MhcPostMix::Params<T>{m.residual.data(), m.post.data(), m.comb.data(), o.out.data()};
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      int mismatches = 0;
      for (std::size_t i = 0; i < expected.size(); ++i)
        mismatches += bits(outs[fiar_test::at(r)].out[i]) != bits(expected[i]);
      CHECK(mismatches == 0);
    }
  }
}

// The token view's reductions: cluster_sum in the canonical order and cluster_max, the same bits at every grid (one
// vector per lane or several, clusters of 1 to 4 blocks).
FIAR_CASE_TEST("user epilogue: cluster sum and max", "[epilogue]", fiar_test::Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 2, tokens = 3, hidden = 8 * 80;  // bf16 / half: 80 vectors, float: 160
  const int vecs = hidden * static_cast<int>(sizeof(T)) / 16, per = 16 / static_cast<int>(sizeof(T));
  const std::vector<T> x = sum_of_call<T>(world, tokens, hidden, 0);
  for (const fiar::HostPlatformOptions grid : {fiar::HostPlatformOptions{.blocks = 1, .lanes = 32, .cluster = 1},
                                               fiar::HostPlatformOptions{.blocks = 4, .lanes = 16, .cluster = 4},
                                               fiar::HostPlatformOptions{.blocks = 2, .lanes = 8, .cluster = 2}}) {
    CAPTURE(grid.blocks, grid.lanes, grid.cluster);
    for (const Strategy s : user_strategies<C>()) {
      CAPTURE(fiar::to_string(s));
      const auto outs = run_user<C, RmsScale>(world, tokens, hidden, s, grid, 1, [&](int, UserOutputs<T>& o) {
        o.out.assign(x.size(), fiar_test::from_float<T>(0.0f));
        o.ss.assign(tokens, -1.0f);
        o.amax.assign(tokens, -1.0f);
        return RmsScale::Params<T>{o.out.data(), o.ss.data(), o.amax.data()};
      });
      for (int t = 0; t < tokens; ++t) {
        CAPTURE(t);
        std::vector<float> q(static_cast<std::size_t>(vecs), 0.0f);
        float amax = 0.0f;
        for (int v = 0; v < vecs; ++v) {
          for (int e = 0; e < per; ++e) {
            const float f = as_float(x[static_cast<std::size_t>(t) * hidden + v * per + e]);
            q[static_cast<std::size_t>(v)] = std::fma(f, f, q[static_cast<std::size_t>(v)]);
            amax = std::max(amax, std::fabs(f));
          }
        }
        const float ss = canonical_sum(q);
        const float scale = 1.0f / std::sqrt(ss / static_cast<float>(hidden) + 1e-6f);
        int mismatches = 0;
        for (int h = 0; h < hidden; ++h) {
          const std::size_t i = static_cast<std::size_t>(t) * hidden + h;
          mismatches += bits(outs[0].out[i]) != bits(fiar_test::from_float<T>(as_float(x[i]) * scale));
        }
        for (int r = 0; r < world; ++r) {
          CHECK(bits(outs[fiar_test::at(r)].ss[static_cast<std::size_t>(t)]) == bits(ss));
          CHECK(outs[fiar_test::at(r)].amax[static_cast<std::size_t>(t)] == amax);
          CHECK(outs[fiar_test::at(r)].out == outs[0].out);
        }
        CHECK(mismatches == 0);
      }
    }
  }
}

// Batch invariance: a token's outputs are the same bits alone and at any position of a larger batch (the canonical sum
// depends on hidden_dim alone).
TEST_CASE("user epilogue: a token's bits alone and in a batch", "[epilogue]") {
  using C = fiar_test::Case<fiar::TrtllmPolicy, __nv_bfloat16>;
  using T = __nv_bfloat16;
  const int world = 2, hidden = 1024;
  auto token_out = [&](int tokens, int at, Strategy s) {
    // Rank r's row `at` is the probe (the same values whatever the batch); the other rows differ with the batch.
    UserOutputs<T> probe;
    auto errors = fiar_test::run_ranks(world, [&](int r, fiar::InProcessBootstrap& boot) {
      fiar::WorkspaceConfig cfg;
      cfg.max_token_num = tokens;
      cfg.hidden_dim = hidden;
      C::workspace ws(boot, C::topology(world, r), cfg, fiar_test::kSmallGrid);
      std::vector<T> in = input_of<T>(tokens, hidden, r, tokens);
      const std::vector<T> row = input_of<T>(1, hidden, r, 99);
      std::copy(row.begin(), row.end(), in.begin() + static_cast<std::ptrdiff_t>(at) * hidden);
      std::vector<T> out(in.size());
      std::vector<float> ss(static_cast<std::size_t>(tokens)), amax(static_cast<std::size_t>(tokens));
      ws.run<RmsScale>(in.data(), tokens, RmsScale::Params<T>{out.data(), ss.data(), amax.data()}, nullptr, s);
      ws.check();
      if (r == 0) {
        probe.out.assign(out.begin() + static_cast<std::ptrdiff_t>(at) * hidden,
                         out.begin() + static_cast<std::ptrdiff_t>(at + 1) * hidden);
        probe.ss = {ss[static_cast<std::size_t>(at)]};
      }
    });
    fiar_test::require_no_errors(errors);
    return probe;
  };
  const UserOutputs<T> alone = token_out(1, 0, Strategy::OneShot);
  for (const auto& [tokens, at, s] : {std::tuple{6, 4, Strategy::OneShot}, std::tuple{9, 0, Strategy::TwoShot},
                                      std::tuple{16, 11, Strategy::TwoShot}}) {
    CAPTURE(tokens, at);
    const UserOutputs<T> batched = token_out(tokens, at, s);
    CHECK(bits(batched.ss[0]) == bits(alone.ss[0]));
    CHECK(std::equal(alone.out.begin(), alone.out.end(), batched.out.begin(),
                     [](T a, T b) { return bits(a) == bits(b); }));
  }
}

// The checks before a launch: the call's (in, num_tokens, the strategy), the epilogue's own why_not, each message
// opening with the epilogue's name; nothing runs, and the workspace stays usable.
TEST_CASE("user epilogue: the call is checked before anything runs", "[epilogue]") {
  using T = __nv_bfloat16;
  const int tokens = 2, hidden = 256;
  auto errors = fiar_test::run_ranks(1, [&](int, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = tokens;
    cfg.hidden_dim = hidden;
    fiar_test::HostWorkspace<T> ws(boot, fiar_test::one_node(1, 0), cfg, fiar_test::kSmallGrid);
    const MhcTensors<T> m(tokens, hidden);
    std::vector<T> in(static_cast<std::size_t>(tokens) * hidden + 8), out(m.residual.size());
    const MhcPostMix::Params<T> good{m.residual.data(), m.post.data(), m.comb.data(), out.data()};
    auto message = [&](const T* x, int n, const MhcPostMix::Params<T>& p, Strategy s = Strategy::Auto) {
      return fiar_test::thrown<std::invalid_argument>([&] { ws.run<MhcPostMix>(x, n, p, nullptr, s); });
    };
    FIAR_ENSURE(message(nullptr, tokens, good) ==
                "fiar: mhc_post_mix on rank 0: in is a null pointer. Fix: pass [num_tokens, hidden_dim] buffers.");
    FIAR_ENSURE(message(in.data(), 3, good)
                    .find("fiar: mhc_post_mix on rank 0: num_tokens = 3; allowed: 1 to "
                          "max_token_num = 2") == 0);
    FIAR_ENSURE(message(in.data() + 1, tokens, good).find("in = 0x") != std::string::npos);
    FIAR_ENSURE(message(in.data() + 1, tokens, good).find("is not 16-byte aligned") != std::string::npos);
    FIAR_ENSURE(message(in.data(), tokens, good, Strategy::Multimem).find("multimem (the in-switch reduction) needs") !=
                std::string::npos);
    MhcPostMix::Params<T> no_out = good;
    no_out.out = nullptr;
    FIAR_ENSURE(message(in.data(), tokens, no_out) ==
                "fiar: mhc_post_mix on rank 0: a null tensor in MhcPostMix::Params; it needs residual, post_mix, "
                "comb_mix and out. Fix: pass all four.");
    FIAR_ENSURE(std::all_of(out.begin(), out.end(), [](T v) { return bits(v) == 0; }));
    ws.run<MhcPostMix>(in.data(), tokens, good);  // still usable
    ws.check();
  });
  fiar_test::require_no_errors(errors);
}

// Ranks that run different epilogues in one call: the digests differ (a user epilogue's code is its name hashed), and
// every rank raises mismatch_error naming a user epilogue.
TEST_CASE("user epilogue: ranks calling different epilogues raise mismatch_error", "[epilogue]") {
  using T = float;
  const int tokens = 2, hidden = 64;
  std::vector<std::string> seen(2);
  auto errors = fiar_test::run_ranks(2, [&](int r, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = tokens;
    cfg.hidden_dim = hidden;
    cfg.timeout = fiar_test::healthy_timeout(2000ms);
    fiar_test::HostWorkspace<T> ws(boot, fiar_test::one_node(2, r), cfg, fiar_test::kSmallGrid);
    const std::vector<T> in = input_of<T>(tokens, hidden, r, 0);
    std::vector<T> out(in.size());
    std::vector<float> ss(tokens), amax(tokens);
    seen[fiar_test::at(r)] = fiar_test::thrown<fiar::mismatch_error>([&] {
      if (r == 0) {
        ws.run<RmsScale>(in.data(), tokens, RmsScale::Params<T>{out.data(), ss.data(), amax.data()});
      } else {
        ws.run<fiar::Pattern::AllReduce>([&] {
          fiar::FusedArgs<T> a;
          a.in = in.data();
          a.out = out.data();
          a.num_tokens = tokens;
          return a;
        }());
      }
      ws.check();
    });
  });
  fiar_test::require_no_errors(errors);
  for (const std::string& s : seen) {
    CAPTURE(s);
    CHECK(s.find("pattern user epilogue 0x") != std::string::npos);
    CHECK(s.find("pattern allreduce") != std::string::npos);
  }
}
