// SPDX-License-Identifier: Apache-2.0
// Calls that cannot go silently wrong, on every backend on the host emulator: ranks that make different calls
// (num_tokens, pattern, strategy) raise fiar::mismatch_error on every rank, naming both calls, long before the
// timeout, and no rank returns data; a two-shot rank that arrives after the owner of a chunk gave up gets an error
// instead of the owner's partial sum.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "../common/cases.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;
using fiar_test::at;
using fiar_test::Cases;
using fiar_test::kSmallGrid;
using fiar_test::LamportCases;
using fiar_test::require_no_errors;
using fiar_test::run_ranks;

namespace {

// What one rank saw: the first call's exception (type and text), a later call's, and how long the first took.
struct Seen {
  std::string kind, first, later;
  std::chrono::steady_clock::duration took{};
};

template <class F>
void record(Seen& s, std::string& into, F&& call) {
  try {
    call();
    into = "(returned)";
  } catch (const fiar::mismatch_error& e) {
    if (s.kind.empty()) s.kind = "mismatch_error";
    into = e.what();
  } catch (const fiar::timeout_error& e) {
    if (s.kind.empty()) s.kind = "timeout_error";
    into = e.what();
  }
}

// One disagreement between the ranks of a group: rank 1 calls differently from the others.
struct Disagreement {
  const char* what;
  int tokens_0, tokens_1;
  bool pattern_differs;
  bool strategy_differs;
  std::vector<std::string> named;  // what every rank's message must contain
};

}  // namespace

FIAR_CASE_TEST("ranks that make different calls all raise mismatch_error naming both, before the timeout", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  // 3 ranks with 4 vectors per token; and 5 ranks with 1 (Lamport only): fewer elements than ranks, so one element
  // checks the digests of several ranks (ranks e, e + E, ...).
  const bool few = C::lamport ? GENERATE(false, true) : false;
  const int hidden = (few ? 16 : 64) / static_cast<int>(sizeof(T));
  const int world = few ? 5 : 3;
  std::vector<Disagreement> cases = {
      {"num_tokens", 4, 2, false, false, {"num_tokens 4", "num_tokens 2"}},
      {"pattern", 4, 4, true, false, {"pattern allreduce", "pattern residual_rmsnorm"}},
  };
  if constexpr (C::lamport) cases.push_back({"strategy", 4, 4, false, true, {"strategy oneshot", "strategy twoshot"}});
  for (const Disagreement& d : cases) {
    CAPTURE(C::name(), d.what, world);
    std::vector<Seen> seen(world);
    auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
      // A 20 s timeout: a mismatch noticed only when a wait expires would show in `took`.
      typename C::workspace ws(boot, C::topology(world, rank),
                               {.max_token_num = 4, .hidden_dim = hidden, .timeout = 20s}, kSmallGrid);
      std::vector<T> in(4 * hidden, fiar_test::from_float<T>(1.0f)), out(4 * hidden), res(4 * hidden),
          res_out(4 * hidden), norm(4 * hidden), gamma(hidden, fiar_test::from_float<T>(1.0f));
      const bool odd = rank == 1;
      const int tokens = odd ? d.tokens_1 : d.tokens_0;
      Strategy strategy = C::lamport ? Strategy::OneShot : Strategy::Auto;
      if (odd && d.strategy_differs) strategy = Strategy::TwoShot;
      auto call = [&] {
        if (odd && d.pattern_differs) {
          fiar::FusedArgs<T> a;
          a.in = in.data();
          a.num_tokens = tokens;
          a.residual_in = res.data();
          a.residual_out = res_out.data();
          a.gamma = gamma.data();
          a.norm_out = norm.data();
          ws.template run<Pattern::ResidualRmsNorm>(a, nullptr, strategy);
        } else {
          ws.allreduce(in.data(), out.data(), tokens, nullptr, strategy);
        }
      };
      Seen& s = seen[at(rank)];
      const auto start = std::chrono::steady_clock::now();
      record(s, s.first, call);
      s.took = std::chrono::steady_clock::now() - start;
      record(s, s.later, [&] { ws.check(); });
    });
    require_no_errors(errors);
    for (int r = 0; r < world; ++r) {
      const Seen& s = seen[at(r)];
      CAPTURE(r, s.first);
      CHECK(s.kind == "mismatch_error");
      CHECK(s.first.find("fiar: " + C::backend_name() + " all-reduce on rank " + std::to_string(r)) !=
            std::string::npos);
      for (const std::string& n : d.named) CHECK(s.first.find(n) != std::string::npos);
      CHECK(s.later == s.first);  // the workspace stays failed
      CHECK(s.took < 10s);
    }
  }
}

FIAR_CASE_TEST("ranks that make the same calls never see a mismatch, with or without verification", "", Cases) {
  using C = TestType;
  using T = typename C::value_type;
  constexpr int kHidden = 32 / static_cast<int>(sizeof(T));
  const bool verify = GENERATE(true, false);
  CAPTURE(C::name(), verify);
  const int world = 2;
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank),
                             {.max_token_num = 6, .hidden_dim = kHidden, .verify_calls = verify}, kSmallGrid);
    for (int call = 0; call < 7; ++call) {
      const int tokens = 1 + call % 6;
      const std::size_t count = static_cast<std::size_t>(tokens) * kHidden;
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, call, false));
      const std::vector<T> want = fiar_test::rank_order_sum(inputs, count);
      std::vector<T> out(count);
      for (Strategy s : C::strategies()) {
        ws.allreduce(inputs[at(rank)].data(), out.data(), tokens, nullptr, s);
        for (std::size_t i = 0; i < count; ++i) FIAR_ENSURE(fiar_test::bits(out[i]) == fiar_test::bits(want[i]));
      }
    }
  });
  require_no_errors(errors);
}

FIAR_CASE_TEST("two-shot: a rank that calls after the owner of a chunk gave up gets an error, not a partial sum", "",
               LamportCases) {
  using C = TestType;
  using T = typename C::value_type;
  if constexpr (std::is_same_v<T, float>) {
    const bool verify = GENERATE(true, false);
    CAPTURE(C::name(), verify);
    constexpr int kHidden = 8;
    std::vector<Seen> seen(2);
    std::vector<std::vector<T>> outs(2);
    auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
      typename C::workspace ws(boot, C::topology(2, rank),
                               {.max_token_num = 2, .hidden_dim = kHidden, .timeout = 200ms, .verify_calls = verify},
                               kSmallGrid);
      std::vector<T> in(2 * kHidden, 1.0f), out(2 * kHidden, -7.0f);
      Seen& s = seen[at(rank)];
      auto call = [&] { ws.allreduce(in.data(), out.data(), 2, nullptr, Strategy::TwoShot); };
      if (rank == 0) {
        record(s, s.first, call);  // rank 1 is not there yet: rank 0 gives up
        boot.barrier();
      } else {
        boot.barrier();  // ... and only then does rank 1 call
        record(s, s.first, call);
      }
      outs[at(rank)] = out;
    });
    require_no_errors(errors);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r, seen[at(r)].first);
      CHECK(seen[at(r)].kind == "timeout_error");
    }
    // The late rank names the owner whose result never came.
    CHECK(seen[1].first.find("waiting for results reduced by rank(s) 0") != std::string::npos);
  }
}
