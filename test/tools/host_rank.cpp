// SPDX-License-Identifier: Apache-2.0
// fiar-host-rank — one rank of a group whose ranks are processes (test/tools/check_processes.py starts them): joins
// the group over the TCP bootstrap (FIAR_* / torchrun / Open MPI variables) or MPI, runs every pattern on every
// backend asked for on the host emulator, and checks each call against the tools' independent reference and against
// the other ranks (a digest of the outputs, all-gathered).
// Exit status: 0 all results matched; 1 a mismatch or another failure; 2 bad arguments; 3 fiar::timeout_error;
// 4 fiar::mismatch_error. Progress lines ("rank R call K") go to stdout, flushed, for a driver that kills a rank.
#include <fiar/fiar.hpp>
#if FIAR_TEST_WITH_MPI
#include <mpi.h>

#include <fiar/comm/mpi_bootstrap.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../tools/verify.hpp"

namespace {

using namespace std::chrono_literals;

struct Args {
  std::string bootstrap = "tcp";
  std::vector<fiar::Backend> backends = {fiar::Backend::Trtllm, fiar::Backend::Mnnvl, fiar::Backend::Nccl};
  std::vector<fiar::Pattern> patterns;  // empty: every pattern
  std::string dtype = "bf16";
  int calls = 2;
  int tokens = 3;
  int hidden = 256;
  int timeout_ms = 20000;    // each call's bound inside the kernels
  int bootstrap_ms = 30000;  // each bootstrap collective's bound
  bool progress = false;
  bool compare = true;  // all-gather a digest of the outputs after each call (a bootstrap collective per call)
  std::optional<std::size_t> nccl_min_bytes;  // trtllm / mnnvl: the NCCL route (0: every call; checked it ran)
};

struct BadArgs : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int to_int(const std::string& key, const std::string& value, int min) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || v < min)
    throw BadArgs(key + " '" + value + "': expected an integer >= " + std::to_string(min));
  return v;
}

fiar::Pattern to_pattern(const std::string& value) {
  for (int i = 0; fiar::is_valid(static_cast<fiar::Pattern>(i)); ++i) {
    if (value == fiar::to_string(static_cast<fiar::Pattern>(i))) return static_cast<fiar::Pattern>(i);
  }
  throw BadArgs("--patterns: unknown pattern '" + value + "'");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(s.substr(start, comma - start));
  out.push_back(s.substr(start));
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (arg == "--progress") {
      a.progress = true;
      continue;
    }
    if (arg == "--no-compare") {
      a.compare = false;
      continue;
    }
    if (eq == std::string::npos) throw BadArgs("expected --name=value, got '" + arg + "'");
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "--bootstrap") {
      if (value != "tcp" && value != "mpi") throw BadArgs("--bootstrap: expected tcp or mpi");
      a.bootstrap = value;
    } else if (key == "--backends") {
      a.backends.clear();
      for (const auto& b : split(value)) a.backends.push_back(fiar::parse_backend(b));
    } else if (key == "--patterns") {
      for (const auto& p : split(value)) a.patterns.push_back(to_pattern(p));
    } else if (key == "--dtype") {
      if (value != "float" && value != "half" && value != "bf16")
        throw BadArgs("--dtype: expected float, half or bf16");
      a.dtype = value;
    } else if (key == "--calls") {
      a.calls = to_int(key, value, 1);
    } else if (key == "--tokens") {
      a.tokens = to_int(key, value, 1);
    } else if (key == "--hidden") {
      a.hidden = to_int(key, value, 16);
    } else if (key == "--timeout-ms") {
      a.timeout_ms = to_int(key, value, 1);
    } else if (key == "--bootstrap-ms") {
      a.bootstrap_ms = to_int(key, value, 1);
    } else if (key == "--nccl-min-bytes") {
      a.nccl_min_bytes = static_cast<std::size_t>(to_int(key, value, 0));
    } else {
      throw BadArgs("unknown option '" + key + "'");
    }
  }
  if (a.patterns.empty()) {
    for (int i = 0; fiar::is_valid(static_cast<fiar::Pattern>(i)); ++i)
      a.patterns.push_back(static_cast<fiar::Pattern>(i));
  }
  return a;
}

// Runs `calls` calls of pattern P on one workspace and checks each; returns the mismatches.
template <fiar::Pattern P, class T, class B>
long run_pattern(B& boot, const Args& a, fiar::Backend backend, long& call_number) {
  fiar::Topology topo = fiar_tools::flag_topology(boot.size(), 1, true, 100);
  topo.rank = boot.rank();
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = a.tokens;
  cfg.hidden_dim = a.hidden;
  cfg.timeout = std::chrono::milliseconds(a.timeout_ms);
  cfg.nccl_min_bytes = a.nccl_min_bytes;
  auto ws = fiar::make_workspace<T, fiar::HostPlatform>(boot, topo, cfg, backend,
                                                        fiar::HostPlatformOptions{.blocks = 2, .lanes = 4});
  if (!ws.platform().across_processes() && boot.size() > 1) {
    throw std::runtime_error("the workspace's memory is not POSIX shared memory: the ranks are not processes?");
  }
  fiar_tools::HostMemory mem;
  fiar_tools::CallTensors<P, T> call(mem, a.tokens, a.hidden);
  long mismatches = 0;
  for (int it = 0; it < a.calls; ++it) {
    call.set_inputs(mem, boot.rank(), it);
    ws.template run<P>(call.a, nullptr, fiar::Strategy::Auto);
    ws.check();
    if (a.nccl_min_bytes == std::size_t{0} && backend != fiar::Backend::Nccl &&
        ws.last_strategy() != fiar::Strategy::Nccl) {
      std::fprintf(stderr, "rank %d: %s call %d ran %s, not the NCCL route\n", boot.rank(),
                   std::string(fiar::to_string(backend)).c_str(), it,
                   std::string(fiar::to_string(ws.last_strategy())).c_str());
      ++mismatches;
    }
    fiar_tools::Check res;
    call.check(mem, boot.size(), it, res);
    mismatches += res.mismatches;
    // Every rank's outputs must be the same bytes: compare digests (a bootstrap collective per call).
    if (a.compare) {
      const auto bytes = call.output_bytes();
      const std::uint64_t digest =
          fiar::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      const auto all = fiar::all_gather_value(boot, digest);
      for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r] != digest) {
          std::fprintf(stderr, "rank %d: %s %s call %d: outputs differ from rank %zu's\n", boot.rank(),
                       std::string(fiar::to_string(backend)).c_str(), fiar::to_string(P), it, r);
          ++mismatches;
        }
      }
    }
    ++call_number;
    if (a.progress) {
      std::printf("rank %d call %ld\n", boot.rank(), call_number);
      std::fflush(stdout);
    }
  }
  return mismatches;
}

template <class T, class B>
long run_all(B& boot, const Args& a) {
  long mismatches = 0, calls = 0;
  for (fiar::Backend backend : a.backends) {
    for (fiar::Pattern p : a.patterns) {
      if (p == fiar::Pattern::ResidualRmsNormNvfp4 && std::is_same_v<T, float>) continue;
      long m = 0;
#define FIAR_RANK_PATTERN_CASE(Unused, P) \
  case fiar::Pattern::P: m = run_pattern<fiar::Pattern::P, T>(boot, a, backend, calls); break;
      switch (p) { FIAR_FOR_EACH_PATTERN(FIAR_RANK_PATTERN_CASE, ) }
#undef FIAR_RANK_PATTERN_CASE
      std::printf("rank %d: %s %s: %d call(s), %ld mismatch(es)\n", boot.rank(),
                  std::string(fiar::to_string(backend)).c_str(), fiar::to_string(p), a.calls, m);
      std::fflush(stdout);
      mismatches += m;
    }
  }
  return mismatches;
}

template <class B>
int run(B& boot, const Args& a) {
  const long mismatches = a.dtype == "float"  ? run_all<float>(boot, a)
                          : a.dtype == "half" ? run_all<__half>(boot, a)
                                              : run_all<__nv_bfloat16>(boot, a);
  std::printf("rank %d of %d: %s\n", boot.rank(), boot.size(), mismatches == 0 ? "PASS" : "FAIL");
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fiar-host-rank: %s\n", e.what());
    return 2;
  }
  const auto started = std::chrono::steady_clock::now();
  const auto elapsed_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  };
  try {
    if (a.bootstrap == "mpi") {
#if FIAR_TEST_WITH_MPI
      MPI_Init(&argc, &argv);
      int code = 0;
      {
        fiar::MpiBootstrap boot(MPI_COMM_WORLD, std::chrono::milliseconds(a.bootstrap_ms));
        code = run(boot, a);
      }
      MPI_Finalize();
      return code;
#else
      std::fprintf(stderr, "fiar-host-rank: built without MPI\n");
      return 2;
#endif
    }
    fiar::TcpBootstrap boot(fiar::TcpBootstrapOptions::from_environment(std::chrono::milliseconds(a.bootstrap_ms)));
    return run(boot, a);
  } catch (const fiar::timeout_error& e) {
    std::printf("timeout_error after %lld ms: %s\n", static_cast<long long>(elapsed_ms()), e.what());
    return 3;
  } catch (const fiar::mismatch_error& e) {
    std::printf("mismatch_error: %s\n", e.what());
    return 4;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
