// SPDX-License-Identifier: Apache-2.0
// Contracts of the decode kernels that no single call shows: calls across the call counter's wrap at 2^32 ([wrap]),
// a token's output bytes independent of the batch, its position, the strategy and the launch shape
// ([invariance]), and in-place calls of every pattern and strategy repeated, which ThreadSanitizer checks in CI
// ([inplace]). Every backend and element type, on the host emulator.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "../common/cases.hpp"
#include "../common/fusion_reference.hpp"
#include "../common/host_fusion_harness.hpp"
#include "../common/host_harness.hpp"
#include "../common/reference.hpp"

using fiar::Pattern;
using fiar::Strategy;
using fiar_test::at;
using fiar_test::Check;
using fiar_test::run_ranks;

namespace {

// The strategies a call of this case may force, the in-switch reduction included on mnnvl.
template <class C>
std::vector<Strategy> every_strategy() {
  std::vector<Strategy> s = C::strategies();
  if constexpr (C::policy::needs_multicast) s.push_back(Strategy::Multimem);
  return s;
}

}  // namespace

// ---- the call counter's wrap ----

FIAR_CASE_TEST("calls across the call counter's wrap at 2^32 are bit-exact, every strategy", "[wrap]",
               fiar_test::Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int world = 3;
  const fiar::WorkspaceConfig cfg{.max_token_num = 8, .hidden_dim = 32, .oneshot_at_max_tokens = true};
  const std::vector<Strategy> strategies = every_strategy<C>();
  const auto first = GENERATE(0xFFFFFFFFu - 4u, 0x7FFFFFFFu - 2u);  // across 2^32, and across the digest's 31 bits
  CAPTURE(C::name(), first);
  std::vector<Check<T>> checks(static_cast<std::size_t>(world));
  std::vector<int> calls(static_cast<std::size_t>(world));
  auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
    typename C::workspace ws(boot, C::topology(world, rank), cfg, fiar_test::kSmallGrid);
    auto call = [&](int c) {
      const int tokens = 3 + (c * 5) % 6;
      const std::size_t count = static_cast<std::size_t>(tokens) * cfg.hidden_dim;
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, c, true));
      std::vector<T> out(count);
      ws.allreduce(inputs[at(rank)].data(), out.data(), tokens, nullptr, strategies[at(c) % strategies.size()]);
      checks[at(rank)].compare(inputs, out, count, world);
      ++calls[at(rank)];
    };
    call(0);  // the rotation is away from buffer 0 when the counter jumps
    call(1);
    boot.barrier();  // every rank is done with call 1 (the nccl emulation's arrival words move with the counter)
    ws.testing_set_call_counter(first);
    boot.barrier();
    for (int c = 2; c < 14; ++c) call(c);  // calls first .. first + 11: the wrap, then every strategy on each side
    ws.check();
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(calls[at(r)] == 14);
    CHECK(checks[at(r)].mismatches == 0);
    CHECK(checks[at(r)].out_of_bound == 0);
  }
}

// ---- batch invariance ----

namespace {

// Deterministic values of one row: a function of (rank, id) only.
template <class T>
std::vector<T> row_values(int hidden, int rank, int id) {
  std::vector<T> v(static_cast<std::size_t>(hidden));
  std::uint32_t x =
      0x9E3779B9u * static_cast<std::uint32_t>(id + 7) + 0x85EBCA6Bu * static_cast<std::uint32_t>(rank + 3);
  for (int i = 0; i < hidden; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float f = static_cast<float>(static_cast<int>(x % 20001u) - 10000) / 2500.0f;
    v[at(i)] = fiar_test::from_float<T>(f);
  }
  return v;
}

struct Run {
  int shape, tokens, pos;
  Strategy strategy;
};

// Every output byte of one row (`token`) of one call: the sum or residual_out, norm_out, the quantized row and its
// scales.
template <Pattern P, class T>
std::vector<std::uint8_t> row_bytes(const fiar_test::Outputs<T>& o, int token, int hidden) {
  std::vector<std::uint8_t> b;
  auto add = [&](const void* p, std::size_t n) {
    const auto* c = static_cast<const std::uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  };
  const std::size_t row = static_cast<std::size_t>(token) * hidden;
  if (!o.out.empty()) add(o.out.data() + row, sizeof(T) * hidden);
  if (!o.residual_out.empty()) add(o.residual_out.data() + row, sizeof(T) * hidden);
  if (!o.norm_out.empty()) add(o.norm_out.data() + row, sizeof(T) * hidden);
  if constexpr (P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic ||
                P == Pattern::ResidualRmsNormFp8Group || P == Pattern::ResidualRmsNormMxfp8) {
    add(o.quant.data() + row, static_cast<std::size_t>(hidden));
  }
  if constexpr (P == Pattern::ResidualRmsNormMxfp8) {
    for (int u = 0; u < hidden / 32; ++u) {
      b.push_back(o.block_scales[fiar::algo::mxfp8_scale_offset(token, u, hidden, fiar::ScaleLayout::Swizzled128x4)]);
    }
  }
  if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) add(o.scale_out.data() + token, sizeof(float));
  if constexpr (P == Pattern::ResidualRmsNormFp8Group) {  // the row's scale bytes (their places follow the batch)
    const int group = fiar_test::group_size_for<T>({}, hidden);
    const int tokens = static_cast<int>(o.quant.size()) / hidden;
    for (int g = 0; g < hidden / group; ++g) {
      b.push_back(o.block_scales[fiar_test::group_scale_at(token, g, tokens, fiar::GroupScale::Ue8m0Packed)]);
    }
  }
  if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
    add(o.quant.data() + row / 2, static_cast<std::size_t>(hidden) / 2);
    for (int u = 0; u < hidden / 16; ++u) {
      b.push_back(o.block_scales[fiar::algo::nvfp4_scale_offset(token, u, hidden, fiar::ScaleLayout::Swizzled128x4)]);
    }
  }
  return b;
}

// Runs, for each emulator shape (a rank's HostPlatformOptions by shape index), the calls of `runs` with that shape:
// the probe row (ids 0) at `pos` of a batch of `tokens` rows whose other rows differ from call to call. Returns each
// rank's bytes of the probe row, per run.
template <Pattern P, class C>
std::vector<std::vector<std::vector<std::uint8_t>>> probe(
    int world, int hidden, const std::vector<Run>& runs,
    const std::vector<std::function<fiar::HostPlatformOptions(int)>>& shapes) {
  using T = typename C::value_type;
  std::vector<std::vector<std::vector<std::uint8_t>>> result(runs.size(),
                                                             std::vector<std::vector<std::uint8_t>>(at(world)));
  int max_tokens = 1;
  for (const Run& r : runs) max_tokens = std::max(max_tokens, r.tokens);
  const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
  for (std::size_t shape = 0; shape < shapes.size(); ++shape) {
    auto errors = run_ranks(world, [&](int rank, fiar::InProcessBootstrap& boot) {
      fiar::WorkspaceConfig cfg{.max_token_num = max_tokens, .hidden_dim = hidden, .oneshot_at_max_tokens = true};
      cfg.batch_invariant = true;
      typename C::workspace ws(boot, C::topology(world, rank, fiar_test::kFusedArch), cfg, shapes[shape](rank));
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const Run& run = runs[i];
        if (run.shape != static_cast<int>(shape)) continue;
        const std::size_t count = static_cast<std::size_t>(run.tokens) * hidden;
        std::vector<T> in(count), residual(count);
        for (int t = 0; t < run.tokens; ++t) {
          const int id = t == run.pos ? 0 : 1 + static_cast<int>(i) * 1000 + t;
          const auto x = row_values<T>(hidden, rank, id), y = row_values<T>(hidden, 99, id);
          std::copy(x.begin(), x.end(), in.begin() + static_cast<std::ptrdiff_t>(t) * hidden);
          std::copy(y.begin(), y.end(), residual.begin() + static_cast<std::ptrdiff_t>(t) * hidden);
        }
        fiar_test::Outputs<T> o;
        const float scale = 0.75f;
        fiar::FusedArgs<T> a;
        a.in = in.data();
        a.num_tokens = run.tokens;
        // The MoE finalize: token t's 4 experts' rows (row_values of id x 8 + k) land at rows that move with the
        // batch and the run; the probe row's experts, holes, weights and shared expert do not.
        constexpr int kTopK = 4;
        const int experts = run.tokens * kTopK;
        std::vector<T> moe_in(static_cast<std::size_t>(experts) * hidden), shared(count);
        std::vector<int> idx(static_cast<std::size_t>(experts));
        std::vector<float> weight(static_cast<std::size_t>(experts));
        if constexpr (fiar::pattern_traits(P).prologue == fiar::Prologue::MoeFinalize) {
          for (int t = 0; t < run.tokens; ++t) {
            const int id = t == run.pos ? 0 : 1 + static_cast<int>(i) * 1000 + t;
            const auto sh = row_values<T>(hidden, rank + 50, id);
            std::copy(sh.begin(), sh.end(), shared.begin() + static_cast<std::ptrdiff_t>(t) * hidden);
            for (int k = 0; k < kTopK; ++k) {
              const int e = t * kTopK + k, row = (e * 7 + static_cast<int>(i)) % experts;
              const auto x = row_values<T>(hidden, rank, id * 8 + k);
              std::copy(x.begin(), x.end(), moe_in.begin() + static_cast<std::ptrdiff_t>(row) * hidden);
              idx[at(e)] = (k + id) % 3 == 0 ? -1 : row;
              weight[at(e)] = 0.125f * static_cast<float>(1 + (k + id) % 5);
            }
          }
          a.in = moe_in.data();
          a.expanded_idx_to_permuted_idx = idx.data();
          a.expert_scale = weight.data();
          a.shared_expert_out = shared.data();
          a.top_k = kTopK;
          a.num_permuted_rows = experts;
        }
        if constexpr (!fiar::pattern_traits(P).norm) {
          o.out.resize(count);
          a.out = o.out.data();
        } else {
          if constexpr (fiar_test::uses<P>(fiar::FusedTensor::ResidualIn)) {
            o.residual_out.resize(count);
            a.residual_in = residual.data();
            a.residual_out = o.residual_out.data();
          }
          o.norm_out.resize(count);
          a.gamma = gamma.data();
          if constexpr (fiar_test::uses<P>(fiar::FusedTensor::GammaPre)) a.gamma_pre = gamma.data();
          a.norm_out = o.norm_out.data();
          a.eps = 1e-5f;
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormNvfp4) a.scale = &scale;
        if constexpr (P == Pattern::ResidualRmsNormFp8 || P == Pattern::ResidualRmsNormFp8Dynamic ||
                      P == Pattern::ResidualRmsNormFp8Group || P == Pattern::ResidualRmsNormMxfp8) {
          o.quant.assign(count, 0xAA);
          a.quant_out = o.quant.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormMxfp8) {
          o.block_scales.assign(fiar::algo::mxfp8_scale_bytes(run.tokens, hidden, fiar::ScaleLayout::Swizzled128x4),
                                0xAA);
          a.block_scale_out = o.block_scales.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8Group) {
          a.group_size = fiar_test::group_size_for<T>({}, hidden);
          o.block_scales.assign(fiar::algo::fp8_group_scale_bytes(run.tokens, hidden, a.group_size, a.group_scale),
                                0xAA);
          a.block_scale_out = o.block_scales.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormFp8Dynamic) {
          o.scale_out.assign(static_cast<std::size_t>(run.tokens), -1.0f);
          a.scale_out = o.scale_out.data();
        }
        if constexpr (P == Pattern::ResidualRmsNormNvfp4) {
          o.quant.assign(count / 2, 0xAA);
          a.quant_out = o.quant.data();
          o.block_scales.assign(fiar::algo::nvfp4_scale_bytes(run.tokens, hidden, fiar::ScaleLayout::Swizzled128x4),
                                0xAA);
          a.block_scale_out = o.block_scales.data();
          a.layout = fiar::ScaleLayout::Swizzled128x4;
        }
        ws.template run<P>(a, nullptr, run.strategy);
        result[i][at(rank)] = row_bytes<P, T>(o, run.pos, hidden);
      }
    });
    fiar_test::require_no_errors(errors);
  }
  return result;
}

template <Pattern P, class C>
void check_invariance() {
  using T = typename C::value_type;
  const int world = 2;
  const int hidden = static_cast<int>(640 / sizeof(T));  // 40 vectors: two chunks of the norm's canonical sum
  using Opt = fiar::HostPlatformOptions;
  std::vector<std::function<Opt(int)>> shapes = {
      [](int) { return Opt{.blocks = 4, .lanes = 16, .cluster = 2}; },
      // the ranks of one group on different shapes (as ranks with different SM counts or limits)
      [](int rank) {
        return rank == 0 ? Opt{.blocks = 1, .lanes = 8, .cluster = 1} : Opt{.blocks = 8, .lanes = 4, .cluster = 4};
      },
  };
  if (!fiar_test::kUnderTsan) shapes.push_back([](int) { return Opt{.blocks = 2, .lanes = 40, .cluster = 2}; });
  // Batches of 2 to 33 rows (every shape's clusters loop over tokens from 17 on; two-shot chunks are uneven), and 129
  // for NVFP4, whose swizzled scales come in tiles of 128 rows.
  const std::vector<int> sizes = P == Pattern::ResidualRmsNormNvfp4 ? fiar_test::sizes_for({2, 17, 129}, {2, 9})
                                                                    : fiar_test::sizes_for({2, 17, 33}, {2, 9});
  std::vector<Run> runs;
  runs.push_back(Run{0, 1, 0, C::lamport ? Strategy::OneShot : Strategy::Auto});  // the row alone: the reference
  for (int shape = 0; shape < static_cast<int>(shapes.size()); ++shape) {
    for (int tokens : sizes) {
      for (int pos : {0, tokens / 2, tokens - 1}) {
        for (Strategy s : C::strategies()) runs.push_back(Run{shape, tokens, pos, s});
      }
      if (C::lamport) runs.push_back(Run{shape, tokens, tokens - 1, Strategy::Auto});
    }
  }
  const auto got = probe<P, C>(world, hidden, runs, shapes);
  const std::vector<std::uint8_t>& reference = got[0][0];
  REQUIRE(!reference.empty());
  int differing = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    for (int r = 0; r < world; ++r) {
      if (got[i][at(r)] == reference) continue;
      if (differing++ < 5) {
        UNSCOPED_INFO("differs: shape " << runs[i].shape << ", " << runs[i].tokens << " rows, position " << runs[i].pos
                                        << ", " << fiar::to_string(runs[i].strategy) << ", rank " << r);
      }
    }
  }
  CAPTURE(C::name(), fiar::to_string(P), runs.size());
  CHECK(differing == 0);
}

}  // namespace

// Every pattern on trtllm (the epilogue is one source for every backend); the richest epilogue (two reductions) and
// the plain sum on mnnvl and nccl. Under ThreadSanitizer fewer sizes and shapes.
FIAR_CASE_TEST("a row's output bytes are the same alone and anywhere in a batch of any size, on any emulator shape",
               "[invariance]", fiar_test::Cases) {
  using C = TestType;
  check_invariance<Pattern::AllReduce, C>();
  check_invariance<Pattern::ResidualRmsNormFp8Dynamic, C>();
  if (fiar_test::kUnderTsan) return;  // the epilogue's other patterns add no cross-thread access of their own
  if constexpr (C::backend == fiar::Backend::Trtllm) {
    check_invariance<Pattern::ResidualRmsNorm, C>();
    check_invariance<Pattern::RmsNorm, C>();
    check_invariance<Pattern::ResidualRmsNormPrePost, C>();
    check_invariance<Pattern::ResidualRmsNormFp8, C>();
    check_invariance<Pattern::ResidualRmsNormFp8Group, C>();
    check_invariance<Pattern::ResidualRmsNormMxfp8, C>();
    check_invariance<Pattern::MoeFinalizeAllReduce, C>();
    check_invariance<Pattern::MoeFinalizeResidualRmsNorm, C>();
    if constexpr (sizeof(typename C::value_type) == 2) check_invariance<Pattern::ResidualRmsNormNvfp4, C>();
  }
}

// The norm's sum of squares is the documented canonical function: an independent computation of it here (fp32
// sums of squares per 16-byte vector with one rounding per step, chunks of 32 vectors by the butterfly, chunk sums
// strided over 32 partials, a last butterfly) gives norm_out's bits exactly.
TEST_CASE("the RMSNorm's sum of squares is the canonical tree of docs/design.md, bit for bit", "[invariance]") {
  using T = __nv_bfloat16;
  const int world = 2, hidden = 8 * 100;  // 100 vectors: 4 chunks, the last one partial
  using C = fiar_test::Case<fiar::TrtllmPolicy, T>;
  const std::vector<Run> runs = {Run{0, 3, 1, Strategy::OneShot}};
  const auto got = probe<Pattern::ResidualRmsNorm, C>(
      world, hidden, runs, {[](int) { return fiar::HostPlatformOptions{.blocks = 2, .lanes = 24, .cluster = 2}; }});
  // The reference: sum in rank order in fp32, y = bf16(sum + residual), then the canonical sum of squares.
  std::vector<float> y(at(hidden));
  for (int i = 0; i < hidden; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) acc += fiar_test::as_float(row_values<T>(hidden, r, 0)[at(i)]);
    const float sum = fiar_test::as_float(fiar_test::from_float<T>(acc));
    y[at(i)] =
        fiar_test::as_float(fiar_test::from_float<T>(sum + fiar_test::as_float(row_values<T>(hidden, 99, 0)[at(i)])));
  }
  auto butterfly = [](std::vector<float> x) {
    for (int m = 16; m > 0; m /= 2) {
      std::vector<float> n(32);
      for (int i = 0; i < 32; ++i) n[at(i)] = x[at(i)] + x[at(i ^ m)];
      x = n;
    }
    return x[0];
  };
  const int vecs = hidden / 8, chunks = (vecs + 31) / 32;
  std::vector<float> partial(32, 0.0f);
  for (int j = 0; j < chunks; ++j) {
    std::vector<float> q(32, 0.0f);
    for (int i = 0; i < 32; ++i) {
      const int v = 32 * j + i;
      if (v >= vecs) continue;
      float s = 0.0f;
      for (int e = 0; e < 8; ++e) s = std::fma(y[at(8 * v + e)], y[at(8 * v + e)], s);
      q[at(i)] = s;
    }
    partial[at(j % 32)] += butterfly(q);
  }
  const float total = butterfly(partial);
  const float s = 1.0f / std::sqrt(total / static_cast<float>(hidden) + 1e-5f);
  const std::vector<T> gamma = fiar_test::gamma_of<T>(hidden);
  std::vector<std::uint8_t> want;
  for (int i = 0; i < hidden; ++i) {
    const T n = fiar_test::from_float<T>(y[at(i)] * s * (0.0f + fiar_test::as_float(gamma[at(i)])));
    const auto* p = reinterpret_cast<const std::uint8_t*>(&n);
    want.insert(want.end(), p, p + sizeof(T));
  }
  const auto& bytes = got[0][0];
  REQUIRE(bytes.size() == 2 * sizeof(T) * hidden);  // residual_out, then norm_out
  const std::vector<std::uint8_t> norm(bytes.begin() + static_cast<std::ptrdiff_t>(sizeof(T) * hidden), bytes.end());
  CHECK(norm == want);
  CHECK(got[0][1] == got[0][0]);
}

FIAR_CASE_TEST("batch_invariant keeps Auto off the NCCL route and the in-switch reduction; forcing them throws",
               "[invariance]", fiar_test::LamportCases) {
  using C = TestType;
  using T = typename C::value_type;
  std::vector<std::string> forced(2), config(2);
  auto errors = run_ranks(2, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 32};
    cfg.batch_invariant = true;
    typename C::workspace ws(boot, C::topology(2, rank), cfg, fiar_test::kSmallGrid);
    FIAR_ENSURE(!ws.has_nccl_route());
    FIAR_ENSURE(ws.strategy_thresholds().nccl_min_bytes == fiar::never);
    FIAR_ENSURE(ws.strategy_thresholds().multimem_min_bytes == fiar::never);
    std::vector<T> in(4 * 32, fiar_test::from_float<T>(1.0f)), out(4 * 32);
    forced[at(rank)] = fiar_test::thrown<std::invalid_argument>([&] {
      ws.allreduce(in.data(), out.data(), 4, nullptr, C::policy::needs_multicast ? Strategy::Multimem : Strategy::Nccl);
    });
    ws.allreduce(in.data(), out.data(), 4, nullptr, Strategy::Auto);  // still serves
    FIAR_ENSURE(fiar_test::as_float(out[0]) == 2.0f);
    fiar::WorkspaceConfig asks = cfg;
    asks.nccl_min_bytes = 1;
    config[at(rank)] = fiar_test::thrown<std::invalid_argument>(
        [&] { typename C::workspace other(boot, C::topology(2, rank), asks, fiar_test::kSmallGrid); });
  });
  fiar_test::require_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(forced[at(r)], Catch::Contains("batch_invariant"));
    CHECK_THAT(config[at(r)], Catch::Contains("batch_invariant") && Catch::Contains("nccl_min_bytes = 1"));
  }
}

// ---- in-place calls, repeated (ThreadSanitizer checks the order of the input's read and the output's write) ----

FIAR_CASE_TEST("in-place calls of every pattern and strategy, repeated", "[inplace]", fiar_test::Cases) {
  using C = TestType;
  using T = typename C::value_type;
  const int repeats = fiar_test::kUnderTsan ? 3 : 6;
  for (Strategy s : every_strategy<C>()) {
    for (int i = 0; i < repeats; ++i) {
      const fiar_test::Shape shape{3, 4 + i % 3, 64};
      fiar_test::run_and_check<Pattern::AllReduce, T, typename C::policy>(shape, s, false, {}, 0.0f, 1.0f, true,
                                                                          &C::topology);
      fiar_test::run_and_check<Pattern::ResidualRmsNormFp8, T, typename C::policy>(shape, s, true, {}, 0.0f, 0.75f,
                                                                                   true, &C::topology);
      fiar_test::run_and_check<Pattern::ResidualRmsNormFp8Dynamic, T, typename C::policy>(shape, s, true, {}, 0.0f,
                                                                                          1.0f, true, &C::topology);
      if constexpr (sizeof(T) == 2) {
        fiar_test::run_and_check<Pattern::ResidualRmsNormNvfp4, T, typename C::policy>(shape, s, true, {}, 1.0f, 100.0f,
                                                                                       true, &C::topology);
      }
    }
  }
}
