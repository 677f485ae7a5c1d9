// SPDX-License-Identifier: Apache-2.0
// fiar-demo — runs real all-reduces through fiar and verifies every rank's result against an independent
// reference: on the GPU (one thread per rank, each with its own stream) or on the host emulator.
// Exit status: 0 every iteration on every rank matched, 1 a mismatch or failure, 2 the configuration is
// rejected or the command line is wrong (one message on stderr; nothing run).
#include <fiar/fiar.hpp>

#include "cli.hpp"
#include "verify.hpp"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using fiar_cli::parse_int;
using namespace fiar_tools;

using fiar_cli::kExitFailed;
using fiar_cli::kExitOk;
using fiar_cli::kExitRejected;

constexpr const char* kUsage = R"(usage: fiar-demo [options]

  --platform host|cuda      where to run (default: cuda when a usable GPU exists, else host)
  --backend NAME            auto, trtllm, mnnvl or nccl (default: $FIAR_ALLREDUCE_BACKEND, else auto)
  --world-size N            ranks (default: GPUs present, else 4); on cuda, ranks beyond the GPU count
                            share GPUs (several ranks per GPU)
  --nodes N                 nodes the host emulator reports (default 1)
  --multicast yes|no|broken NVLink multicast on the host emulator (default no); broken: reported by the
                            topology but its setup fails on the machine (bridged NVLink), which shows
                            auto's fallback from mnnvl to trtllm
  --arch sm_90|sm_100       architecture the host emulator reports (default sm_90)
  --interconnect pcie|nvlink|unknown
                            how the GPUs of a node reach each other (default: unknown on the host emulator,
                            discovered on GPUs, where the flag overrides it); auto does not pick trtllm on
                            pcie beyond 2 ranks
  --dtype float|half|bf16   element type (default bf16)
  --tokens N                tokens per call (default 16)
  --hidden N                hidden size (default 4096)
  --iterations N            calls per rank (default 10)
  --strategy auto|oneshot|twoshot|multimem|nccl   (default auto; multimem: the in-switch reduction, mnnvl only;
                            nccl: ncclAllReduce inside the workspace, its NCCL route)
  --pattern NAME            allreduce, residual_rmsnorm, residual_rmsnorm_fp8, residual_rmsnorm_fp8_dynamic,
                            residual_rmsnorm_nvfp4 (16-bit dtypes on sm_100+), rmsnorm,
                            residual_rmsnorm_prepost, residual_rmsnorm_fp8_group (groups of 128
                            elements where the hidden size allows), residual_rmsnorm_mxfp8 (hidden
                            size a multiple of 32), moe_finalize_allreduce or
                            moe_finalize_residual_rmsnorm (4 experts per token; default allreduce)
  -h, --help                this text
  --version                 fiar-demo's version

Each option takes its value as --flag value or --flag=value. FIAR_LOG_LEVEL=info also logs the workspace's
backend choice and its reasons (one line).
exit status: 0 all results matched, 1 mismatch or failure, 2 configuration rejected or bad command line
)";

struct Options {
  std::string platform;  // "" = choose
  std::optional<fiar::Backend> backend;
  std::optional<int> world_size;
  int nodes = 1;
  bool multicast = false;         // the topology reports multicast
  bool multicast_broken = false;  // ... but setting it up fails on the (emulated) machine
  int arch = 90;
  std::optional<fiar::Interconnect> interconnect;
  std::string dtype = "bf16";
  int tokens = 16;
  int hidden = 4096;
  int iterations = 10;
  fiar::Strategy strategy = fiar::Strategy::Auto;
  fiar::Pattern pattern = fiar::Pattern::AllReduce;
};

void add_options(fiar_cli::CommandLine& cli, Options& o) {
  using Text = const std::string&;
  cli.option("--platform", [&o](Text flag, Text v) { o.platform = parse_choice(flag, v, "host", "cuda"); });
  cli.option("--backend", [&o](Text, Text v) { o.backend = fiar::parse_backend(v); });
  cli.option("--world-size", [&o](Text flag, Text v) { o.world_size = parse_int(flag, v, 1); });
  cli.option("--nodes", [&o](Text flag, Text v) { o.nodes = parse_int(flag, v, 1); });
  cli.option("--multicast", [&o](Text flag, Text v) {
    const std::string m = parse_choice(flag, v, "yes", "no", "broken");
    o.multicast = m != "no";
    o.multicast_broken = m == "broken";
  });
  cli.option("--arch",
             [&o](Text flag, Text v) { o.arch = parse_choice(flag, v, "sm_90", "sm_100") == "sm_90" ? 90 : 100; });
  cli.option("--interconnect", [&o](Text flag, Text v) {
    const std::string i = parse_choice(flag, v, "pcie", "nvlink", "unknown");
    o.interconnect = i == "pcie"     ? fiar::Interconnect::Pcie
                     : i == "nvlink" ? fiar::Interconnect::NvLink
                                     : fiar::Interconnect::Unknown;
  });
  cli.option("--dtype", [&o](Text flag, Text v) { o.dtype = parse_choice(flag, v, "float", "half", "bf16"); });
  cli.option("--tokens", [&o](Text flag, Text v) { o.tokens = parse_int(flag, v, 1); });
  cli.option("--hidden", [&o](Text flag, Text v) { o.hidden = parse_int(flag, v, 1); });
  cli.option("--iterations", [&o](Text flag, Text v) { o.iterations = parse_int(flag, v, 1); });
  cli.option("--strategy", [&o](Text flag, Text v) { o.strategy = parse_strategy(flag, v); });
  cli.option("--pattern", [&o](Text flag, Text v) { o.pattern = parse_pattern(flag, v); });
}

struct RankResult : Check {
  fiar::Backend backend = fiar::Backend::Auto;  // what ran
  bool fell_back = false;
  fiar::Strategy strategy = fiar::Strategy::Auto;  // what the last call ran
  std::vector<unsigned char> last_bytes;           // the last outputs, to compare across ranks
  std::string error;
};

// Sized for the shape the demo runs; a forced one-shot needs buffers for one-shot at every token count.
fiar::WorkspaceConfig demo_config(const Options& o) {
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = o.tokens;
  cfg.hidden_dim = o.hidden;
  cfg.oneshot_at_max_tokens = o.strategy == fiar::Strategy::OneShot;
  // --strategy nccl on trtllm / mnnvl: the workspace's NCCL route, from the first byte.
  if (o.strategy == fiar::Strategy::Nccl) cfg.nccl_min_bytes = 0;
  return cfg;
}

template <fiar::Pattern P, class T, class Platform>
RankResult run_rank(fiar::InProcessBootstrap& boot, const fiar::Topology& topo, const Options& o,
                    fiar::Backend requested, const typename Platform::Options& popts, Memory& mem) {
  RankResult res;
  // The backend every rank agrees on (with auto's fallback from mnnvl to trtllm where allowed).
  auto ws = fiar::make_workspace<T, Platform>(boot, topo, demo_config(o), requested, popts);
  res.backend = ws.backend();
  res.fell_back = ws.fell_back();
  CallTensors<P, T> call(mem, o.tokens, o.hidden);
  for (int it = 0; it < o.iterations; ++it) {
    call.set_inputs(mem, topo.rank, it);
    ws.template run<P>(call.a, mem.stream(), o.strategy);
    mem.sync();
    ws.check();
    res.strategy = ws.last_strategy();
    call.check(mem, topo.world_size, it, res);
  }
  res.last_bytes = call.output_bytes();
  return res;
}

template <class T, class Platform>
RankResult run_pattern(fiar::InProcessBootstrap& boot, const fiar::Topology& topo, const Options& o,
                       fiar::Backend requested, const typename Platform::Options& popts, Memory& mem) {
  // One instantiation per pattern of fiar's table.
#define FIAR_DEMO_PATTERN_CASE(Unused, P) \
  case fiar::Pattern::P: return run_rank<fiar::Pattern::P, T, Platform>(boot, topo, o, requested, popts, mem);
  switch (o.pattern) { FIAR_FOR_EACH_PATTERN(FIAR_DEMO_PATTERN_CASE, ) }
#undef FIAR_DEMO_PATTERN_CASE
  throw std::logic_error("unknown pattern");
}

template <class T>
int run(const Options& o, const std::string& platform, int world, int gpus, fiar::Backend requested) {
  // The topology: reported by flags on the host emulator, discovered on the GPUs.
  fiar::Topology topo = flag_topology(world, o.nodes, o.multicast, o.arch);
  std::vector<std::string> notes;
  if (platform == "cuda") {
    const fiar::DiscoveryReport report = discover_on_gpus(world, gpus);
    topo = report.topology;
    notes = report.notes;
  }
  if (o.interconnect) topo.interconnect = *o.interconnect;
  std::printf("topology: %s\n", fiar::to_string(topo).c_str());
  for (const auto& n : notes) std::printf("  note: %s\n", n.c_str());

  fiar::Resolution res{};
  try {
    res = fiar::resolve_backend(requested, topo);
  } catch (const std::invalid_argument& e) {
    std::printf("backend: %s REJECTED\n", std::string(fiar::to_string(requested)).c_str());
    std::fprintf(stderr, "%s\n", e.what());
    return kExitRejected;
  }
  std::string why = requested == fiar::Backend::Auto ? "auto" : "requested";
  if (requested == fiar::Backend::Auto) {
    fiar::find_first(fiar::BackendPolicies{}, [&](auto p) {
      const fiar::Backend b = decltype(p)::type::backend;
      if (b == res.backend) return true;
      const std::string no = fiar::why_not(b, topo);
      why += "; " + std::string(fiar::to_string(b)) +
             (no.empty() ? " passed by: " + fiar::why_auto_skips(b, topo) : " cannot run: " + no);
      return false;
    });
  }
  std::printf("backend: %s (%s%s)\n", std::string(fiar::to_string(res.backend)).c_str(), why.c_str(),
              res.allow_trtllm_fallback ? "; trtllm if multicast setup fails" : "");
  // The configuration against the chosen backend's limits, before any rank starts.
  std::string config_error;
  const fiar::WorkspaceConfig cfg = demo_config(o);
  fiar::with_policy(res.backend, [&](auto p) {
    config_error = fiar::Workspace<typename decltype(p)::type, T, fiar::HostPlatform>::why_not(topo, cfg);
  });
  if (!config_error.empty()) {
    std::fprintf(stderr, "%s\n", config_error.c_str());
    return kExitRejected;
  }

  if (o.pattern == fiar::Pattern::ResidualRmsNormNvfp4) {
    const char* why = std::is_same_v<T, float> ? "it takes 16-bit input; pass --dtype half or bf16"
                      : topo.arch < 100        ? "it needs sm_100 or newer (on the host emulator: --arch sm_100)"
                      : o.hidden % 16 != 0     ? "it needs a hidden size that is a multiple of 16"
                                               : nullptr;
    if (why != nullptr) {
      std::fprintf(stderr, "fiar-demo: residual_rmsnorm_nvfp4 cannot run here (%s, %s): %s.\n",
                   std::string(fiar::dtype_name<T>()).c_str(), fiar::arch_name(topo.arch).c_str(), why);
      return kExitRejected;
    }
  }
  std::vector<RankResult> results(static_cast<std::size_t>(world));
  std::fflush(stdout);  // fiar's warnings (stderr) come after what was printed so far
  fiar::InProcessGroup group(world);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto& out = results[static_cast<std::size_t>(r)];
      fiar::Topology mine = topo;
      mine.rank = r;
      auto boot = group.bootstrap(r);
      try {
        if (platform == "host") {
          HostMemory mem;
          fiar::HostPlatformOptions popts;
          popts.multicast = o.multicast && !o.multicast_broken;
          out = run_pattern<T, fiar::HostPlatform>(boot, mine, o, requested, popts, mem);
        } else {
          use_rank_device(r, gpus);
          DeviceMemory mem(r);
          out = run_pattern<T, fiar::CudaPlatform>(boot, mine, o, requested, fiar::CudaPlatformOptions{}, mem);
        }
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const RankResult& first = results[0];
  if (first.error.empty()) {
    const bool warned = fiar::log_enabled(fiar::LogLevel::Warning);
    std::printf("ran: %s%s\n", std::string(fiar::to_string(first.backend)).c_str(),
                !first.fell_back ? ""
                : warned         ? " (mnnvl's multicast setup failed; fell back to trtllm, see the warning above)"
                                 : " (mnnvl's multicast setup failed; fell back to trtllm)");
  }
  std::printf("pattern: %s\n", fiar::to_string(o.pattern));
  std::printf("shape: %d tokens x %d hidden, %s, %d iteration(s), strategy %s -> %s\n", o.tokens, o.hidden,
              std::string(fiar::dtype_name<T>()).c_str(), o.iterations,
              std::string(fiar::to_string(o.strategy)).c_str(),
              first.backend == fiar::Backend::Nccl ? "nccl (its own algorithm)"
                                                   : std::string(fiar::to_string(first.strategy)).c_str());

  long mismatches = 0;
  double max_error = 0;
  int failed = 0;
  bool identical = true;
  std::vector<bool> reported(static_cast<std::size_t>(world), false);
  for (int r = 0; r < world; ++r) {
    const auto& res_r = results[static_cast<std::size_t>(r)];
    if (!res_r.error.empty()) {
      ++failed;
      if (reported[static_cast<std::size_t>(r)]) continue;
      // Ranks that failed with the same message (a collective failure is raised on every rank) share one line.
      std::string others;
      for (int q = r + 1; q < world; ++q) {
        if (results[static_cast<std::size_t>(q)].error == res_r.error) {
          reported[static_cast<std::size_t>(q)] = true;
          others += (others.empty() ? "" : ", ") + std::to_string(q);
        }
      }
      std::fprintf(stderr, "rank %d failed%s: %s\n", r, others.empty() ? "" : (" (and rank(s) " + others + ")").c_str(),
                   res_r.error.c_str());
      continue;
    }
    mismatches += res_r.mismatches;
    max_error = std::max(max_error, res_r.max_error);
    identical = identical && res_r.last_bytes == results[0].last_bytes;
  }
  if (failed != 0) {
    // What failed ran nothing to compare: say so instead of reporting the comparison of the ranks that finished.
    std::printf("fiar-demo: FAIL: %d of %d rank(s) failed (see above); their results were not verified, %.2f s wall\n",
                failed, world, seconds);
    return kExitFailed;
  }
  const bool ok = mismatches == 0 && identical;
  std::printf(
      "fiar-demo: %s: %d rank(s) x %d iteration(s) on %s, %ld element(s) outside the bound, max |error| %.3g, "
      "ranks %s, %.2f s wall\n",
      ok ? "PASS" : "FAIL", world, o.iterations, platform.c_str(), mismatches, max_error,
      identical ? "bit-identical" : "DIFFER", seconds);
  return ok ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  fiar::Backend requested = fiar::Backend::Auto;
  fiar_cli::CommandLine cli("fiar-demo", kUsage);
  add_options(cli, o);
  if (const auto status = cli.parse(argc, argv, [&] { requested = o.backend ? *o.backend : fiar::backend_from_env(); }))
    return *status;
  const PlatformChoice choice = choose_platform("fiar-demo", o.platform);
  if (choice.platform.empty()) return kExitRejected;
  const std::string& platform = choice.platform;
  const int gpus = choice.gpus;
  const int world = o.world_size.value_or(platform == "cuda" ? gpus : 4);
  std::printf("fiar-demo %s: platform %s%s\n", fiar::version_string, platform.c_str(),
              platform == "host"
                  ? (" (host emulator; " +
                     (gpus > 0 ? std::string("a GPU is present") : "no usable GPU: " + choice.no_gpu) + ")")
                        .c_str()
                  : "");
  try {
    if (o.dtype == "float") return run<float>(o, platform, world, gpus, requested);
    if (o.dtype == "half") return run<__half>(o, platform, world, gpus, requested);
    return run<__nv_bfloat16>(o, platform, world, gpus, requested);
  } catch (const std::exception& e) {
    return fiar_cli::exit_status_of("fiar-demo", e);
  }
}
