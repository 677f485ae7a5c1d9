// SPDX-License-Identifier: Apache-2.0
// What every backend must do, written once over the {backend x element type} cases of test/common/cases.hpp and
// run on the host emulator: results bit-exact against the rank-order reference (test/common/reference.hpp) and the
// fused reference (fusion_reference.hpp), special values, aliasing, one-shot == two-shot (Lamport backends), calls
// rejected before anything runs (and the workspace intact after), collective creation failures, bounded waits,
// move-only handles. Each test case is tagged with its backend ([trtllm], [mnnvl], [nccl]) and [backends]; what is
// particular to one backend stays in test_<backend>.cpp.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <regex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/cases.hpp"
#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::at;
using fiar_test::bits;
using fiar_test::Cases;
using fiar_test::FloatCases;
using fiar_test::kSmallGrid;
using fiar_test::LamportCases;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;

namespace {

// Every explicit strategy of the case in turn, and for a backend with several, all of them alternating per call.
template <class C>
std::vector<std::vector<Strategy>> schedules() {
  std::vector<std::vector<Strategy>> out;
  for (Strategy s : C::strategies()) out.push_back({s});
  if (C::strategies().size() > 1) out.push_back(C::strategies());
  return out;
}

// Creates C's workspace on `world` ranks with cfg_of(rank) (and options_of(rank)) and returns what each rank threw.
template <class C, class CfgOf, class OptionsOf>
std::vector<std::string> create_on_every_rank(int world, CfgOf cfg_of, OptionsOf options_of,
                                              std::chrono::milliseconds bootstrap_timeout = 30s) {
  return run_ranks(
      world,
      [&](int rank, fiar::InProcessBootstrap& boot) {
        typename C::workspace ws(boot, C::topology(world, rank), cfg_of(rank), options_of(rank));
      },
      bootstrap_timeout);
}

fiar::HostPlatformOptions small_grid(int) { return kSmallGrid; }

// What a call that must be accepted records (fiar_test::thrown's if_none); any other text is a rejection.
const std::string kAccepted = "(accepted)";

// For each call of a sequence, the fragments its rejection message must contain (or exactly {kAccepted}).
using Expected = std::vector<std::vector<std::string>>;

// Checks every rank's messages, one per call, against expected_of(rank).
template <class ExpectedOf>
void check_messages(const std::string& name, const std::vector<std::vector<std::string>>& messages,
                    ExpectedOf expected_of) {
  for (std::size_t r = 0; r < messages.size(); ++r) {
    const Expected expected = expected_of(static_cast<int>(r));
    CAPTURE(name, r);
    REQUIRE(messages[r].size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const std::string& got = messages[r][i];
      CAPTURE(i, got);
      for (const std::string& fragment : expected[i]) {
        if (fragment == kAccepted) {
          CHECK(got == kAccepted);
        } else {
          CHECK(got.find(fragment) != std::string::npos);
        }
      }
    }
  }
}

}  // namespace

// ---- results ----

FIAR_CASE_TEST("all-reduce matches the rank-order reference bit for bit on every rank", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  // The union of the backends' former sweeps: trtllm (2, 4, 6, 8 ranks) and nccl (1, 2, 4, 8) with hidden 48,
  // mnnvl (2, 4, 8, 16) with hidden 24.
  const auto [world, hidden] =
      GENERATE(table<int, int>({{1, 48}, {2, 24}, {2, 48}, {4, 24}, {4, 48}, {6, 48}, {8, 24}, {8, 48}, {16, 24}}));
  const Strategy strategy = GENERATE(from_range(C::strategies()));
  CAPTURE(C::name(), world, hidden, fiar::to_string(strategy));
  const fiar::WorkspaceConfig cfg{.max_token_num = 2 * world + 1, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
  const std::vector<int> tokens = {1, std::max(world - 1, 1), world, 2 * world + 1, 3};
  const auto ran = fiar_test::run_and_check<T, typename C::policy>(
      world, cfg, static_cast<int>(tokens.size()), [&](int c) { return tokens[at(c)]; }, [&](int) { return strategy; },
      /*in_place=*/false, /*specials=*/true, &C::topology);
  for (Strategy s : ran) CHECK(s == strategy);
}

FIAR_CASE_TEST("special values: -0, subnormals and sentinel-equal words reduce like any other value", "", Cases) {
  // First every input word is the Lamport sentinel (fp32 -0, or a (+0, -0) pair of 16-bit values); then each
  // element is -0, a negative subnormal of T times (rank + 1), +0, or subnormals that cancel (-1, -2, -3 and +6
  // steps: the partial sums are negative, the sum is zero). Nothing may hang or be taken for missing data; -0 sums
  // to +0, the subnormals add exactly (1 + 2 + 3 + 4 = 10 steps), and the cancelling ones give +0, never -0 (a
  // two-shot owner forwards its rounded sum as it is: a -0 there could be the sentinel).
  using C = TestType;
  using T = typename C::value_type;
  const int world = 4, tokens = 4, hidden = 64;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  const Strategy strategy = GENERATE(from_range(C::strategies()));
  CAPTURE(C::name(), fiar::to_string(strategy));
  const float step = std::is_same_v<T, float>    ? std::ldexp(1.0f, -149)
                     : std::is_same_v<T, __half> ? std::ldexp(1.0f, -24)
                                                 : std::ldexp(1.0f, -133);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank),
                             {.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true},
                             kSmallGrid);
    std::vector<T> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) {
      in[i] =
          sizeof(T) == 4 ? fiar_test::from_float<T>(-0.0f) : fiar_test::from_bits<T>(i % 2 == 0 ? 0x0000u : 0x8000u);
    }
    ws.allreduce(in.data(), out.data(), tokens, nullptr, strategy);
    for (const T& x : out) wrong[at(rank)] += bits(x) != 0u;
    const float cancel = rank == 3 ? 6.0f * step : -step * static_cast<float>(rank + 1);
    for (std::size_t i = 0; i < count; ++i) {
      in[i] = fiar_test::from_float<T>(i % 4 == 0   ? -0.0f
                                       : i % 4 == 1 ? -step * static_cast<float>(rank + 1)
                                       : i % 4 == 2 ? 0.0f
                                                    : cancel);
    }
    ws.allreduce(in.data(), out.data(), tokens, nullptr, strategy);
    for (std::size_t i = 0; i < count; ++i) {
      const T expect = fiar_test::from_float<T>(i % 4 == 1 ? -step * 10.0f : 0.0f);  // +0 for the cancelling ones
      wrong[at(rank)] += bits(out[i]) != bits(expect);
    }
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(wrong[at(r)] == 0);
  }
}

FIAR_CASE_TEST("one-shot and two-shot give identical bits", "", LamportCases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 6, tokens = 13, hidden = 40;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  const fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
  std::vector<std::vector<T>> one(world), two(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank), cfg, kSmallGrid);
    const auto in = fiar_test::make_input<T>(count, rank, 5);
    one[at(rank)].resize(count);
    two[at(rank)].resize(count);
    ws.allreduce(in.data(), one[at(rank)].data(), tokens, nullptr, Strategy::OneShot);
    ws.allreduce(in.data(), two[at(rank)].data(), tokens, nullptr, Strategy::TwoShot);
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < count; ++i) REQUIRE(bits(one[at(r)][i]) == bits(two[at(r)][i]));
  }
}

FIAR_CASE_TEST("ranks may run different emulated grids", "", FloatCases) {
  using C = TestType;
  const int world = 3;
  std::vector<std::vector<float>> outs(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank), {.max_token_num = 7, .hidden_dim = 20},
                             fiar::HostPlatformOptions{.blocks = rank + 1, .lanes = 2 + rank});
    std::vector<float> in(7 * 20, static_cast<float>(rank + 1)), out(7 * 20);
    auto strategies = C::strategies();
    std::reverse(strategies.begin(), strategies.end());  // two-shot first, as a fresh workspace's first call
    for (Strategy s : strategies) {
      std::fill(out.begin(), out.end(), 0.0f);
      ws.allreduce(in.data(), out.data(), 7, nullptr, s);
      FIAR_ENSURE(std::all_of(out.begin(), out.end(), [](float x) { return x == 6.0f; }));
    }
    outs[at(rank)] = out;
  });
  require_no_errors(errors);
  for (const auto& o : outs) CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 6.0f; }));
}

// ---- aliasing ----

FIAR_CASE_TEST("in place: out may alias in", "", Cases) {
  using C = TestType;
  const auto schedule = GENERATE(from_range(schedules<C>()));
  std::string names;
  for (Strategy s : schedule) names += std::string(fiar::to_string(s)) + " ";
  CAPTURE(C::name(), names);
  const fiar::WorkspaceConfig cfg{.max_token_num = 9, .hidden_dim = 32, .oneshot_at_max_tokens = true};
  const auto ran = fiar_test::run_and_check<typename C::value_type, typename C::policy>(
      4, cfg, 8, [](int c) { return 2 + c; }, [&](int c) { return schedule[at(c) % schedule.size()]; },
      /*in_place=*/true, /*specials=*/true, &C::topology);
  for (std::size_t c = 0; c < ran.size(); ++c) CHECK(ran[c] == schedule[c % schedule.size()]);
}

// RmsNorm (no residual) and the pre/post norm ride along, in place and not, with weight_bias 0 and 1: every backend,
// dtype and strategy.
FIAR_CASE_TEST("in place fused: out == in, norm_out == in, residual_out == residual_in", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  using P = typename C::policy;
  const Strategy strategy = GENERATE(from_range(C::strategies()));
  const fiar_test::Shape s{4, 6, 256};
  const auto topo = &C::topology;
  fiar_test::run_and_check<Pattern::AllReduce, T, P>(s, strategy, false, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNorm, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::RmsNorm, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::RmsNorm, T, P>(s, strategy, true, {}, 1.0f, 1.0f, false, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormPrePost, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormPrePost, T, P>(s, strategy, true, {}, 1.0f, 1.0f, false, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormFp8Dynamic, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormFp8Group, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormFp8Group, T, P>(
      s, strategy, false, fiar_test::QuantOptions(64, fiar::GroupScale::Float32), 1.0f, 1.0f, false, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormMxfp8, T, P>(s, strategy, true, {}, 0.0f, 1.0f, true, topo);
  // The MoE finalize (its `in` cannot be aliased: the outputs are separate; residual_out == residual_in in place).
  fiar_test::run_and_check<Pattern::MoeFinalizeAllReduce, T, P>(
      s, strategy, false, fiar_test::QuantOptions::moe(8, true), 0.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::MoeFinalizeResidualRmsNorm, T, P>(
      s, strategy, true, fiar_test::QuantOptions::moe(6, false, 2.5f), 1.0f, 1.0f, true, topo);
  fiar_test::run_and_check<Pattern::ResidualRmsNormMxfp8, T, P>(s, strategy, false, fiar::ScaleLayout::Linear, 1.0f,
                                                                1.0f, false, topo);
  if constexpr (sizeof(T) == 2) {
    fiar_test::run_and_check<Pattern::ResidualRmsNormNvfp4, T, P>(s, strategy, true, {}, 0.0f, 100.0f, true, topo);
  }
}

// vLLM's plain sum beside the norm: a zero residual_in and residual_out == in. The aliased call gives the same bits as
// the same call into separate buffers (whose sums and norms the tests above check against the reference): in ends
// holding the sum + 0, norm_out the norm of it. Every backend, dtype and strategy; a second call proves the protocol
// state intact.
FIAR_CASE_TEST("in place fused: residual_out == in with a zero residual (vLLM's sum beside the norm)", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const Strategy strategy = GENERATE(from_range(C::strategies()));
  CAPTURE(C::name(), fiar::to_string(strategy));
  const int world = 4, tokens = 6, hidden = 256;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<int> differ(world, -1);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
    if (strategy == Strategy::Nccl) cfg.nccl_min_bytes = count * sizeof(T);
    typename C::workspace ws(boot, C::topology(world, rank), cfg, kSmallGrid);
    const std::vector<T> input = fiar_test::make_input<T>(count, rank, 0, false);
    const std::vector<T> zero(count, fiar_test::from_float<T>(0.0f)), gamma = fiar_test::gamma_of<T>(hidden);
    int wrong = 0;
    for (int call = 0; call < 2; ++call) {
      std::vector<T> apart = input, sum(count), norm_apart(count), aliased = input, norm_aliased(count);
      fiar::FusedArgs<T> a{.in = apart.data(),
                           .num_tokens = tokens,
                           .residual_in = zero.data(),
                           .residual_out = sum.data(),
                           .gamma = gamma.data(),
                           .eps = 1e-5f,
                           .norm_out = norm_apart.data()};
      ws.template run<Pattern::ResidualRmsNorm>(a, nullptr, strategy);
      a.in = aliased.data();
      a.residual_out = aliased.data();
      a.norm_out = norm_aliased.data();
      ws.template run<Pattern::ResidualRmsNorm>(a, nullptr, strategy);
      for (std::size_t i = 0; i < count; ++i) {
        wrong += bits(aliased[i]) != bits(sum[i]) || bits(norm_aliased[i]) != bits(norm_apart[i]);
      }
    }
    differ[at(rank)] = wrong;
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) CHECK(differ[at(r)] == 0);
}

// ---- validation ----

FIAR_CASE_TEST("bad calls are rejected before anything runs, naming the value and the limit; the workspace still works",
               "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 2, tokens = 8, hidden = 16;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  std::vector<std::vector<std::string>> messages(world);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank), {.max_token_num = tokens, .hidden_dim = hidden},
                             kSmallGrid);
    alignas(16) T in[tokens * hidden + kVec] = {}, out[tokens * hidden + kVec] = {};
    auto& m = messages[at(rank)];
    auto reject = [&](auto&& f) { m.push_back(fiar_test::thrown<std::invalid_argument>(f, kAccepted)); };
    reject([&] { ws.allreduce(nullptr, out, 1); });
    reject([&] { ws.allreduce(in, nullptr, 1); });
    reject([&] { ws.allreduce(in, out, 0); });
    reject([&] { ws.allreduce(in, out, tokens + 1); });
    reject([&] { ws.allreduce(in + 1, out, 1); });
    reject([&] { ws.allreduce(in, out + 1, 1); });
    reject([&] { ws.allreduce(in, in + kVec, 1); });  // out starts 16 bytes into in
    // A forced strategy: a Lamport backend runs it (8 tokens fit one-shot's default threshold); nccl has none.
    reject([&] { ws.allreduce(in, out, tokens, nullptr, Strategy::OneShot); });
    reject([&] { ws.allreduce(in, out, tokens, nullptr, Strategy::TwoShot); });
    // Nothing was launched: the protocol state is intact and a valid call still reduces correctly.
    std::fill(in, in + tokens * hidden, fiar_test::from_float<T>(static_cast<float>(rank + 1)));
    ws.allreduce(in, out, tokens);
    wrong[at(rank)] =
        static_cast<int>(std::count_if(out, out + tokens * hidden, [](T x) { return fiar_test::as_float(x) != 3.0f; }));
  });
  require_no_errors(errors);
  const std::string row_bytes = std::to_string(hidden * sizeof(T));
  check_messages(C::name(), messages, [&](int r) -> Expected {
    const std::string where = "allreduce on rank " + std::to_string(r) + ": ";
    Expected e = {
        {where + "in is a null pointer"},
        {where + "out is a null pointer"},
        {"num_tokens = 0; allowed: 1 to max_token_num = 8"},
        {"num_tokens = 9; allowed: 1 to max_token_num = 8"},
        {"in = 0x", "not 16-byte aligned"},
        {"out = 0x", "not 16-byte aligned"},
        {"out (0x", row_bytes + " bytes) overlaps in ("},
    };
    if constexpr (C::lamport) {
      e.push_back({kAccepted});
      e.push_back({kAccepted});
    } else {
      e.push_back({where + "strategy oneshot",
                   "the " + C::backend_name() + " backend has no one-shot / two-shot choice",
                   "Fix: pass Strategy::Auto"});
      e.push_back({where + "strategy twoshot"});
    }
    return e;
  });
  for (int r = 0; r < world; ++r) CHECK(wrong[at(r)] == 0);
}

FIAR_CASE_TEST("fused calls are checked against the pattern before anything runs; the workspace still works", "",
               Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 2, tokens = 4, hidden = 64;
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  std::vector<std::vector<std::string>> messages(world);
  std::vector<int> wrong(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = tokens, .hidden_dim = hidden};
    typename C::workspace ws(boot, C::topology(world, rank, 90), cfg, kSmallGrid);
    typename C::workspace w100(boot, C::topology(world, rank, 100), cfg, kSmallGrid);
    // res has room for a residual_out shifted 8 elements into it, overlapping nothing else.
    std::vector<T> in(count), res(count + 8), res_out(count), norm(count), gamma(hidden);
    std::vector<std::uint8_t> q(count), sf(512);
    const float scale = 1.0f;
    auto& m = messages[at(rank)];
    auto reject = [&](auto&& f) { m.push_back(fiar_test::thrown<std::invalid_argument>(f, kAccepted)); };
    fiar::FusedArgs<T> a;
    a.in = in.data();
    a.num_tokens = tokens;
    a.residual_in = res.data();
    a.residual_out = res_out.data();
    a.gamma = gamma.data();
    a.norm_out = norm.data();
    auto nvfp4 = a;
    nvfp4.quant_out = q.data();
    nvfp4.scale = &scale;
    nvfp4.block_scale_out = sf.data();
    // `a` with one field changed: each call below breaks one rule of its pattern.
    const auto but = [&](auto change) {
      auto b = a;
      change(b);
      return b;
    };
    const auto rmsnorm = [&](const fiar::FusedArgs<T>& b) { ws.template run<Pattern::ResidualRmsNorm>(b); };
    reject([&] { rmsnorm(but([](auto& b) { b.gamma = nullptr; })); });
    reject([&] { rmsnorm(but([](auto& b) { b.norm_out = nullptr; })); });
    reject([&] { rmsnorm(but([&](auto& b) { b.out = norm.data(); })); });
    reject([&] { rmsnorm(but([&](auto& b) { b.norm_out = res_out.data(); })); });
    reject([&] { rmsnorm(but([&](auto& b) { b.residual_out = res.data() + 8; })); });
    reject([&] { ws.template run<Pattern::ResidualRmsNormFp8>(but([&](auto& b) { b.quant_out = q.data(); })); });
    reject([&] { rmsnorm(but([](auto& b) { b.eps = -1e-7f; })); });
    // Per-token-group FP8: the group size (hidden 64 holds no group of 128; 24 is 3 vectors of bf16, 6 of float),
    // its format, and block_scale_out's int32 / fp32 alignment.
    const auto group = [&](auto change) {
      auto b = a;
      b.quant_out = q.data();
      b.block_scale_out = sf.data();
      b.group_size = 16;
      change(b);
      ws.template run<Pattern::ResidualRmsNormFp8Group>(b);
    };
    reject([&] { group([](auto& b) { b.group_size = 128; }); });
    reject([&] { group([](auto& b) { b.group_size = 24; }); });
    reject([&] { group([](auto& b) { b.group_scale = static_cast<fiar::GroupScale>(9); }); });
    reject([&] { group([&](auto& b) { b.block_scale_out = sf.data() + 1; }); });
    // The MoE finalize: top_k, num_permuted_rows, the scaling factor, and no output over its `in` (out == in).
    std::vector<int> idx(tokens * 2, -1);
    std::vector<float> weights(tokens * 2, 1.0f);
    std::vector<T> out(count);
    const auto moe = [&](auto change) {
      fiar::FusedArgs<T> b{.in = in.data(), .num_tokens = tokens, .out = out.data()};
      b.expanded_idx_to_permuted_idx = idx.data();
      b.expert_scale = weights.data();
      b.top_k = 2;
      b.num_permuted_rows = tokens;
      change(b);
      ws.template run<Pattern::MoeFinalizeAllReduce>(b);
    };
    reject([&] { moe([](auto& b) { b.top_k = 0; }); });
    reject([&] { moe([](auto& b) { b.num_permuted_rows = 0; }); });
    reject([&] { moe([](auto& b) { b.routed_scaling_factor = std::numeric_limits<float>::infinity(); }); });
    reject([&] { moe([&](auto& b) { b.out = in.data(); }); });
    // MXFP8: the layout value.
    reject([&] {
      auto b = a;
      b.quant_out = q.data();
      b.block_scale_out = sf.data();
      b.layout = static_cast<fiar::ScaleLayout>(3);
      ws.template run<Pattern::ResidualRmsNormMxfp8>(b);
    });
    // Values cast from integers outside their enumerations are rejected, not run as some default.
    reject([&] { ws.template run<Pattern::ResidualRmsNorm>(a, nullptr, static_cast<Strategy>(7)); });
    if constexpr (sizeof(T) == 2) {
      reject([&] { ws.template run<Pattern::ResidualRmsNormNvfp4>(nvfp4); });  // sm_90
      reject([&] {
        auto b = nvfp4;
        b.layout = static_cast<fiar::ScaleLayout>(5);
        w100.template run<Pattern::ResidualRmsNormNvfp4>(b);
      });
    } else {
      reject([&] { w100.template run<Pattern::ResidualRmsNormNvfp4>(nvfp4); });
    }
    // Nothing was launched: a valid fused call still works on both workspaces.
    std::fill(in.begin(), in.end(), fiar_test::from_float<T>(1.0f));
    std::fill(gamma.begin(), gamma.end(), fiar_test::from_float<T>(1.0f));
    for (auto* w : {&ws, &w100}) {
      std::fill(res.begin(), res.end(), fiar_test::from_float<T>(2.0f));
      std::fill(res_out.begin(), res_out.end(), T{});
      std::fill(norm.begin(), norm.end(), T{});
      w->template run<Pattern::ResidualRmsNorm>(a);
      for (std::size_t i = 0; i < count; ++i) {
        wrong[at(rank)] += fiar_test::as_float(res_out[i]) != 4.0f || fiar_test::as_float(norm[i]) != 1.0f;
      }
    }
  });
  require_no_errors(errors);
  check_messages(C::name(), messages, [](int r) -> Expected {
    Expected e = {
        {"residual_rmsnorm on rank " + std::to_string(r) + ": gamma is a null pointer; residual_rmsnorm needs it"},
        {"norm_out is a null pointer; residual_rmsnorm needs it"},
        {"out = 0x", "does not write it"},
        {"norm_out", "residual_out", "overlaps norm_out"},
        {"overlaps residual_in"},
        {"scale is a null pointer; residual_rmsnorm_fp8 needs it"},
        {"eps = -1e-07, weight_bias = 0;"},  // the value as given, not -0.000000
        {"residual_rmsnorm_fp8_group on rank", "group_size = 128 for",
         "with hidden_dim = 64; allowed:", "dividing hidden_dim"},
        {"group_size = 24 for"},
        {"GroupScale value 9 is not a format; allowed: ue8m0_packed, float32"},
        {"block_scale_out = 0x", "is not 4-byte aligned"},
        {"moe_finalize_allreduce on rank", "top_k = 0; allowed: 1 to 64"},
        {"num_permuted_rows = 0; allowed: 1 or more"},
        {"routed_scaling_factor = inf; allowed: a finite value"},
        {"out (0x", "overlaps in (0x", "Allowed: residual_out == residual_in, exactly (the MoE finalize"},
        {"residual_rmsnorm_mxfp8 on rank", "ScaleLayout value 3 is not a layout"},
        {"Strategy value 7 is not a strategy; allowed: auto, oneshot, twoshot"},
    };
    if constexpr (sizeof(T) == 2) {
      e.push_back({"NVFP4 needs sm_100 or newer, and this workspace runs on sm_90"});
      e.push_back({"ScaleLayout value 5 is not a layout; allowed: swizzled128x4, linear"});
    } else {
      e.push_back({"the input is float; NVFP4 takes 16-bit input"});
    }
    return e;
  });
  for (int r = 0; r < world; ++r) CHECK(wrong[at(r)] == 0);
}

FIAR_CASE_TEST("a forced strategy beyond the buffer's capacity is rejected with the sizes", "", LamportCases) {
  // A one-shot threshold of 2 tokens sizes the buffers for two-shot at 32 tokens: (4 x 8 + 32) rows of 16 elements
  // (4096 bytes for float), which holds one-shot (4 rows per token) up to 16 tokens.
  using C = TestType;
  using T = typename C::value_type;
  const fiar::WorkspaceConfig cfg{.max_token_num = 32, .hidden_dim = 16, .oneshot_max_bytes = 2 * 16 * sizeof(T)};
  std::vector<std::string> msg(4);
  std::vector<int> sufficient(4);
  auto errors = run_ranks(4, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(4, rank), cfg, kSmallGrid);
    sufficient[at(rank)] = ws.is_buffer_size_sufficient(16, Strategy::OneShot) * 1 +
                           ws.is_buffer_size_sufficient(17, Strategy::OneShot) * 2 +
                           ws.is_buffer_size_sufficient(32, Strategy::TwoShot) * 4 +
                           ws.is_buffer_size_sufficient(32) * 8 + ws.is_buffer_size_sufficient(33) * 16 +
                           ws.is_buffer_size_sufficient(0) * 32;
    std::vector<T> in(32 * 16), out(32 * 16);
    msg[at(rank)] = fiar_test::thrown<std::invalid_argument>(
        [&] { ws.allreduce(in.data(), out.data(), 32, nullptr, Strategy::OneShot); }, kAccepted);
  });
  require_no_errors(errors);
  const std::size_t row = 16 * sizeof(T);
  const std::string expected = "oneshot with num_tokens = 32 needs " + std::to_string(128 * row) +
                               " bytes per Lamport buffer; this workspace has " + std::to_string(64 * row);
  for (int r = 0; r < 4; ++r) {
    CAPTURE(C::name(), r, msg[at(r)]);
    CHECK(sufficient[at(r)] == 1 + 4 + 8);
    CHECK(msg[at(r)].find(expected) != std::string::npos);
  }
}

// ---- creation ----

FIAR_CASE_TEST("creation: bad configurations are rejected on every rank", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const std::string dtype(fiar::dtype_name<T>());
  std::vector<std::pair<fiar::WorkspaceConfig, std::string>> rows = {
      {{.max_token_num = 0, .hidden_dim = 16}, "max_token_num = 0; allowed: 1 or more"},
      {{.max_token_num = 4, .hidden_dim = 6},
       "hidden_dim = 6 for " + dtype + "; allowed: a positive multiple of " + std::to_string(16 / sizeof(T))},
      {{.max_token_num = 4, .hidden_dim = 16, .timeout = 0ms}, "timeout = 0 ms; allowed: 1 ms to 24 h"},
  };
  // Lamport buffers have a size limit; nccl would try to allocate this.
  if constexpr (C::lamport) rows.push_back({{.max_token_num = 1 << 30, .hidden_dim = 8192}, "allowed: at most 16 GiB"});
  for (const auto& [cfg, expected] : rows) {
    const auto errors = create_on_every_rank<C>(3, [&](int) { return cfg; }, small_grid);
    for (const auto& e : errors) {
      CAPTURE(C::name(), e);
      CHECK(e.find(expected) != std::string::npos);
    }
  }
}

FIAR_CASE_TEST("creation: a configuration one rank rejects fails every rank, naming that rank", "", Cases) {
  using C = TestType;
  const int bad_hidden = GENERATE(7, 30);  // whole 16-byte vectors of no element type
  const auto errors = create_on_every_rank<C>(
      3, [&](int rank) { return fiar::WorkspaceConfig{.max_token_num = 4, .hidden_dim = rank == 1 ? bad_hidden : 32}; },
      small_grid);
  const std::string own = "WorkspaceConfig::hidden_dim = " + std::to_string(bad_hidden);
  CAPTURE(C::name(), errors[0], errors[1], errors[2]);
  CHECK(errors[1].find(own + " for " + std::string(fiar::dtype_name<typename C::value_type>())) != std::string::npos);
  for (int r : {0, 2}) {
    CHECK(errors[at(r)].find("workspace creation failed because rank 1 rejected it: " + own) != std::string::npos);
  }
}

FIAR_CASE_TEST("creation: ranks with different configurations all throw the same error, naming both", "", Cases) {
  using C = TestType;
  const auto errors = create_on_every_rank<C>(
      3, [](int rank) { return fiar::WorkspaceConfig{.max_token_num = rank == 2 ? 16 : 8, .hidden_dim = 32}; },
      small_grid);
  const std::string rank2 = "rank 2 has {backend " + C::backend_name() + ", dtype " +
                            std::string(fiar::dtype_name<typename C::value_type>()) +
                            ", world_size 3, max_token_num 16";
  for (const auto& e : errors) {
    CAPTURE(C::name(), e);
    CHECK(e.find("workspace configurations differ between ranks") != std::string::npos);
    CHECK(e.find(rank2) != std::string::npos);
    CHECK(e == errors[0]);
  }
}

FIAR_CASE_TEST("creation: a topology that does not match the bootstrap fails every rank", "", Cases) {
  using C = TestType;
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 16};
  SECTION("another world size") {
    auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
      typename C::workspace ws(boot, C::topology(4, rank), cfg, kSmallGrid);
    });
    CAPTURE(C::name(), errors[0], errors[1]);
    CHECK(errors[0].find("the topology says world_size 4, rank 0, but the bootstrap says size 2") != std::string::npos);
    CHECK(errors[1].find("rank 0 rejected it") != std::string::npos);
  }
  SECTION("another rank") {
    auto errors = run_ranks(3, [&](int rank, fiar::InProcessBootstrap& boot) {
      typename C::workspace ws(boot, C::topology(3, rank == 0 ? 1 : rank), cfg, kSmallGrid);
    });
    CAPTURE(C::name(), errors[0], errors[1], errors[2]);
    CHECK(errors[0].find("the topology says world_size 3, rank 1, but the bootstrap says size 3, rank 0") !=
          std::string::npos);
    CHECK(errors[1].find("rank 0 rejected it") != std::string::npos);
    CHECK(errors[2].find("rank 0 rejected it") != std::string::npos);
  }
}

FIAR_CASE_TEST("creation: a bad emulator grid on one rank makes every rank throw, none waits", "", Cases) {
  using C = TestType;
  const auto errors = create_on_every_rank<C>(
      3, [](int) { return fiar::WorkspaceConfig{.max_token_num = 2, .hidden_dim = 16}; },
      [](int rank) { return fiar::HostPlatformOptions{.blocks = rank == 1 ? 0 : 2, .lanes = 4}; }, 20s);
  CAPTURE(C::name(), errors[0], errors[1], errors[2]);
  CHECK(errors[1].find("host emulator grid of 0 blocks x 4 lanes") != std::string::npos);
  for (int r : {0, 2}) {
    CHECK(errors[at(r)].find("HostPlatform setup failed on rank 1: host emulator grid of 0 blocks") !=
          std::string::npos);
  }
}

// ---- failures after creation ----

FIAR_CASE_TEST(
    "a rank that stops calling: the others get timeout_error naming it within the deadline, then stay failed", "",
    FloatCases) {
  using C = TestType;
  const int world = 4;
  const int healthy_calls = GENERATE(0, 1);  // rank 3 never calls at all, or stops after a call of every rank
  const Strategy strategy = GENERATE(from_range(C::strategies()));
  // 4 vectors per token, or 1 with one token: fewer elements than ranks, so one element checks several digests
  const int hidden = GENERATE(16, 4);
  const int tokens = hidden == 16 ? 4 : 1;
  CAPTURE(C::name(), healthy_calls, fiar::to_string(strategy), hidden);
  // Ranks 0-2 must meet it: in the healthy calls, and in the failing one, where rank 3 alone is named.
  const auto timeout = fiar_test::healthy_timeout(300ms);
  std::vector<fiar_test::AfterPeerStopped> seen(world);
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank),
                             {.max_token_num = 4, .hidden_dim = hidden, .timeout = timeout}, kSmallGrid);
    std::vector<float> in(64, 1.0f), out(64);
    const auto call = [&] { ws.allreduce(in.data(), out.data(), tokens, nullptr, strategy); };
    for (int c = 0; c < healthy_calls; ++c) call();
    if (rank == 3) return;
    seen[at(rank)] = fiar_test::after_peer_stopped(ws, call);
  });
  require_no_errors(errors);
  // Rank 3 is named; on a loaded machine a live rank whose push came later than the deadline may be named with it
  // ("rank(s) 1, 3"), which is what the protocol saw.
  const std::string waited =
      C::lamport ? "waiting for data from rank\\(s\\) " : "waiting for the input of rank\\(s\\) ";
  const std::regex named("fiar: " + C::backend_name() + " all-reduce on rank [0-2] gave up after " +
                         std::to_string(timeout.count()) + " ms " + waited + "([0-2], )*3 \\(call " +
                         std::to_string(healthy_calls) + "\\)");
  for (int r = 0; r < world - 1; ++r) {
    const auto& s = seen[at(r)];
    CAPTURE(r, s.first);
    CHECK(std::regex_search(s.first, named));
    CHECK(s.first.find("all-reduce on rank " + std::to_string(r) + " gave up") != std::string::npos);
    CHECK(s.later == s.first);
    CHECK(s.checked == s.first);
    CHECK(s.took >= timeout);
    CHECK(s.took < 10s);
  }
}

FIAR_CASE_TEST("a moved workspace keeps working; the moved-from one refuses calls", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  constexpr int kHidden = 16 / static_cast<int>(sizeof(T));  // one vector per token
  auto errors = run_ranks(2, [](int rank, fiar::InProcessBootstrap& boot) {
    const fiar::WorkspaceConfig cfg{.max_token_num = 2, .hidden_dim = kHidden};
    typename C::workspace a(boot, C::topology(2, rank), cfg, kSmallGrid);
    const std::vector<T> in(2 * kHidden, fiar_test::from_float<T>(1.0f));
    std::vector<T> out(2 * kHidden);
    auto all_two = [&] {
      return std::all_of(out.begin(), out.end(), [](T x) { return fiar_test::as_float(x) == 2.0f; });
    };
    a.allreduce(in.data(), out.data(), 2);
    typename C::workspace b(std::move(a));
    std::fill(out.begin(), out.end(), T{});
    b.allreduce(in.data(), out.data(), 2);
    FIAR_ENSURE(all_two());
    FIAR_ENSURE_THROWS_AS(a.check(), std::logic_error);
    FIAR_ENSURE_THROWS_AS(a.allreduce(in.data(), out.data(), 2), std::logic_error);
    typename C::workspace c(boot, C::topology(2, rank), cfg, kSmallGrid);
    c = std::move(b);
    std::fill(out.begin(), out.end(), T{});
    c.allreduce(in.data(), out.data(), 2);
    FIAR_ENSURE(all_two());
    FIAR_ENSURE_THROWS_AS(b.check(), std::logic_error);
  });
  require_no_errors(errors);
}
