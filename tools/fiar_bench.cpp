// SPDX-License-Identifier: Apache-2.0
// fiar-bench — the benchmark users run on their machines, in the conventions of nccl-tests: a sweep of sizes (bytes
// per rank, -b/-e/-f) or of tokens x hidden, per row the time of one call as the max across ranks (median, p99, min,
// max over -n iterations after -w warm-up calls; CUDA events on GPUs, optionally -G calls per CUDA graph), algbw and
// busbw (2(W-1)/W), and #wrong: every row's outputs are checked on every rank against an independent reference.
// One-shot, two-shot and the automatic choice are separate rows; the nccl backend (ncclAllReduce, then the same
// epilogue as a kernel of its own) is the unfused baseline wherever NCCL can run. --plan prints the CUDA launch of
// every row without running anything and without a GPU. On the host emulator the results are checked but the times
// are not representative.
// Exit status: 0 every row ran and every result matched, 1 a wrong result or a failure, 2 a bad command line or a
// configuration fiar rejects.
#include <fiar/fiar.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "verify.hpp"

namespace {

using fiar::Pattern;
using fiar::Strategy;
using fiar_cli::parse_int;
using fiar_cli::UsageError;
using namespace fiar_tools;

using fiar_cli::kExitFailed;
using fiar_cli::kExitOk;
using fiar_cli::kExitRejected;

constexpr const char* kUsage = R"(usage: fiar-bench [options]

  selection (named as in fiar-demo; LIST: comma-separated values)
  --platform host|cuda        where to run (default: cuda when a usable GPU exists, else host)
  --backend LIST              auto, trtllm, mnnvl, nccl (default: auto, plus nccl as the baseline where NCCL can
                              run: one GPU per rank, or the host emulator)
  --world-size N              ranks (default: GPUs present, else 4); on cuda, ranks beyond the GPU count share GPUs
  --nodes N, --multicast yes|no, --arch sm_90|sm_100
                              the topology the host emulator (and --plan) reports (default 1 node, no, sm_90)
  --dtype float|half|bf16     element type (default bf16)
  --pattern LIST              allreduce, residual_rmsnorm, residual_rmsnorm_fp8, residual_rmsnorm_fp8_dynamic,
                              residual_rmsnorm_nvfp4, rmsnorm, residual_rmsnorm_prepost, residual_rmsnorm_fp8_group,
                              residual_rmsnorm_mxfp8, moe_finalize_allreduce, moe_finalize_residual_rmsnorm
                              (default allreduce)
  --strategy LIST             auto, oneshot, twoshot, multimem, nccl (default: one-shot, two-shot and auto on
                              trtllm, the same plus multimem on mnnvl; the nccl backend runs auto; multimem rows run
                              on mnnvl only; nccl rows on trtllm / mnnvl take the workspace's NCCL route)
  --nccl-min-bytes BYTES|never
                              trtllm / mnnvl: WorkspaceConfig::nccl_min_bytes (default: the strategy table's; with
                              nccl rows and no value, the largest row's size, so that the route exists)
  --tokens LIST               tokens per call (default 1,2,4,...,512; host emulator 1,4,16)
  --hidden N                  hidden size (default 8192; host emulator 1024)
  -b BYTES, -e BYTES, -f F    instead of --tokens: sizes per rank from -b to -e, times F each step (default F 2);
                              a size below one row of --hidden runs one token of size / sizeof(dtype) elements
  timing
  -n N                        timed calls per row (default 20; host emulator 5)
  -w N                        warm-up calls per row (default 5; host emulator 1)
  -G N                        CUDA-graph mode: N calls captured into one graph, replayed -n times (cuda only)
  --verify-calls 0|1          exchange call digests (default 1; 0 shows the digest's cost)
  output
  --json FILE, --csv FILE     also write the rows as a JSON array of objects / as CSV
  --plan                      print each row's CUDA launch (strategy, blocks, threads per block, cluster) and exit,
                              without running and without a GPU
  --sms N                     --plan: SMs per GPU (default 132, H100 / H200)
  --ranks-per-gpu N           --plan: ranks sharing one GPU (default 1)
  -h, --help                  this text
  --version                   fiar-bench's version

Each option takes its value as --flag value or --flag=value (a short one as -b 256 or -b256).
exit status: 0 every row ran and matched, 1 a wrong result or a failure, 2 bad command line or configuration
)";

struct Options {
  std::string platform;
  std::vector<fiar::Backend> backends;  // empty: auto + the nccl baseline
  std::optional<int> world_size;
  int nodes = 1;
  bool multicast = false;
  int arch = 90;
  std::string dtype = "bf16";
  std::vector<Pattern> patterns = {Pattern::AllReduce};
  std::vector<Strategy> strategies;  // empty: oneshot, twoshot, auto
  std::optional<std::size_t> nccl_min_bytes;
  std::vector<int> tokens;  // empty: the platform's default
  std::optional<int> hidden;
  std::optional<long long> size_begin, size_end;
  int size_factor = 2;
  std::optional<int> iterations, warmup;
  int graph_calls = 0;
  bool verify_calls = true;
  std::string json, csv;
  bool plan = false;
  int sms = 132;
  int ranks_per_gpu = 1;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

long long parse_bytes(std::string_view flag, const std::string& text) {
  // nccl-tests style: 8, 64K, 1M, 2G.
  std::string digits = text;
  long long unit = 1;
  if (!digits.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    if (last == 'K' || last == 'M' || last == 'G') {
      unit = last == 'K' ? 1024LL : last == 'M' ? 1024LL * 1024 : 1024LL * 1024 * 1024;
      digits.pop_back();
    }
  }
  try {
    return static_cast<long long>(parse_int(flag, digits, 1)) * unit;
  } catch (const UsageError&) {
    throw UsageError(std::string(flag) + " " + fiar_cli::quoted(text) +
                     ": expected a size in bytes >= 1, such as 256, 64K, 1M or 2G");
  }
}

void add_options(fiar_cli::CommandLine& cli, Options& o) {
  using Text = const std::string&;
  cli.flag("--plan", o.plan);
  cli.option("--platform", [&o](Text flag, Text v) { o.platform = parse_choice(flag, v, "host", "cuda"); });
  cli.option("--backend", [&o](Text, Text v) {
    o.backends.clear();
    for (const auto& b : split(v)) o.backends.push_back(fiar::parse_backend(b));
  });
  cli.option("--world-size", [&o](Text flag, Text v) { o.world_size = parse_int(flag, v, 1); });
  cli.option("--nodes", [&o](Text flag, Text v) { o.nodes = parse_int(flag, v, 1); });
  cli.option("--multicast", [&o](Text flag, Text v) { o.multicast = parse_choice(flag, v, "yes", "no") == "yes"; });
  cli.option("--arch",
             [&o](Text flag, Text v) { o.arch = parse_choice(flag, v, "sm_90", "sm_100") == "sm_90" ? 90 : 100; });
  cli.option("--dtype", [&o](Text flag, Text v) { o.dtype = parse_choice(flag, v, "float", "half", "bf16"); });
  cli.option("--pattern", [&o](Text flag, Text v) {
    o.patterns.clear();
    for (const auto& p : split(v)) o.patterns.push_back(parse_pattern(flag, p));
  });
  cli.option("--strategy", [&o](Text flag, Text v) {
    o.strategies.clear();
    for (const auto& st : split(v)) o.strategies.push_back(parse_strategy(flag, st));
  });
  cli.option("--nccl-min-bytes", [&o](Text flag, Text v) {
    o.nccl_min_bytes = v == "never" ? fiar::never : static_cast<std::size_t>(parse_bytes(flag, v));
  });
  cli.option("--tokens", [&o](Text flag, Text v) {
    o.tokens.clear();
    for (const auto& t : split(v)) o.tokens.push_back(parse_int(flag, t, 1));
  });
  cli.option("--hidden", [&o](Text flag, Text v) { o.hidden = parse_int(flag, v, 1); });
  cli.option("-b", [&o](Text flag, Text v) { o.size_begin = parse_bytes(flag, v); });
  cli.option("-e", [&o](Text flag, Text v) { o.size_end = parse_bytes(flag, v); });
  cli.option("-f", [&o](Text flag, Text v) { o.size_factor = parse_int(flag, v, 2); });
  cli.option("-n", [&o](Text flag, Text v) { o.iterations = parse_int(flag, v, 1); });
  cli.option("-w", [&o](Text flag, Text v) { o.warmup = parse_int(flag, v, 0); });
  cli.option("-G", [&o](Text flag, Text v) { o.graph_calls = parse_int(flag, v, 0); });
  cli.option("--verify-calls", [&o](Text flag, Text v) { o.verify_calls = parse_choice(flag, v, "0", "1") == "1"; });
  cli.option("--json", [&o](Text, Text v) { o.json = v; });
  cli.option("--csv", [&o](Text, Text v) { o.csv = v; });
  cli.option("--sms", [&o](Text flag, Text v) { o.sms = parse_int(flag, v, 1); });
  cli.option("--ranks-per-gpu", [&o](Text flag, Text v) { o.ranks_per_gpu = parse_int(flag, v, 1); });
}

// The rules across options, once every value is read.
void check_options(const Options& o) {
  if (o.size_begin.has_value() != o.size_end.has_value()) throw UsageError("-b and -e go together");
  if (o.size_begin && !o.tokens.empty()) throw UsageError("--tokens and -b/-e are two sweeps: pass one of them");
  if (o.size_begin && *o.size_begin > *o.size_end) throw UsageError("-b is larger than -e");
}

// One point of the sweep.
struct Point {
  int tokens, hidden;
};

// The sweep's points for element type T: tokens x hidden, or the sizes -b .. -e (a size below one row is one token
// of size / sizeof(T) elements, rounded down to whole 16-byte vectors).
template <class T>
std::vector<Point> points(const Options& o, bool host) {
  const int hidden = o.hidden.value_or(host ? 1024 : 8192);
  std::vector<Point> out;
  if (o.size_begin) {
    const long long row = static_cast<long long>(hidden) * static_cast<long long>(sizeof(T));
    for (long long s = *o.size_begin; s <= *o.size_end; s *= o.size_factor) {
      if (s >= row) {
        out.push_back({static_cast<int>(s / row), hidden});
      } else {
        const int elems = static_cast<int>(s / 16 * 16 / static_cast<long long>(sizeof(T)));
        if (elems > 0) out.push_back({1, elems});
      }
    }
    return out;
  }
  std::vector<int> tokens = o.tokens;
  if (tokens.empty())
    tokens = host ? std::vector<int>{1, 4, 16} : std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  for (int t : tokens) out.push_back({t, hidden});
  return out;
}

// One row of the output.
struct Row {
  long long size_bytes = 0;
  int tokens = 0, hidden = 0;
  std::string dtype, pattern, backend, strategy, ran;
  // timings (run mode)
  double time_us = 0, p99_us = 0, min_us = 0, max_us = 0, algbw = 0, busbw = 0;
  long wrong = 0;
  std::string error;
  // launch plan (--plan)
  int blocks = 0, threads = 0, cluster = 0;
  std::string kernel;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The shortest text that reads back as x (full precision: 35967.71 stays 35967.71); JSON's null where x is not finite.
std::string number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

void write_outputs(const Options& o, const std::vector<Row>& rows, const std::string& platform, int world,
                   bool shared_gpu) {
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "[\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << "  {\"size_bytes\": " << r.size_bytes << ", \"tokens\": " << r.tokens << ", \"hidden\": " << r.hidden
        << ", \"dtype\": " << json_string(r.dtype) << ", \"pattern\": " << json_string(r.pattern)
        << ", \"backend\": " << json_string(r.backend) << ", \"strategy\": " << json_string(r.strategy)
        << ", \"ran\": " << json_string(r.ran) << ", \"world_size\": " << world
        << ", \"platform\": " << json_string(platform) << ", \"ranks_share_gpu\": " << (shared_gpu ? "true" : "false");
      if (o.plan) {
        f << ", \"kernel\": " << json_string(r.kernel) << ", \"blocks\": " << r.blocks << ", \"threads\": " << r.threads
          << ", \"cluster\": " << r.cluster;
      } else {
        f << ", \"time_us\": " << number(r.time_us) << ", \"p99_us\": " << number(r.p99_us)
          << ", \"min_us\": " << number(r.min_us) << ", \"max_us\": " << number(r.max_us)
          << ", \"algbw_gbps\": " << number(r.algbw) << ", \"busbw_gbps\": " << number(r.busbw)
          << ", \"wrong\": " << r.wrong << ", \"graph_calls\": " << o.graph_calls
          << ", \"verify_calls\": " << (o.verify_calls ? "true" : "false") << ", \"error\": " << json_string(r.error);
      }
      f << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "]\n";
    if (!f) throw std::runtime_error("cannot write " + o.json + ": " + std::strerror(errno));
  }
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    if (o.plan) {
      f << "size_bytes,tokens,hidden,dtype,pattern,backend,strategy,ran,kernel,blocks,threads,cluster\n";
    } else {
      f << "size_bytes,tokens,hidden,dtype,pattern,backend,strategy,ran,time_us,p99_us,min_us,max_us,algbw_gbps,"
           "busbw_gbps,wrong\n";
    }
    for (const Row& r : rows) {
      f << r.size_bytes << "," << r.tokens << "," << r.hidden << "," << r.dtype << "," << r.pattern << "," << r.backend
        << "," << r.strategy << "," << r.ran << ",";
      if (o.plan) {
        f << r.kernel << "," << r.blocks << "," << r.threads << "," << r.cluster << "\n";
      } else {
        f << number(r.time_us) << "," << number(r.p99_us) << "," << number(r.min_us) << "," << number(r.max_us) << ","
          << number(r.algbw) << "," << number(r.busbw) << "," << r.wrong << "\n";
      }
    }
    if (!f) throw std::runtime_error("cannot write " + o.csv + ": " + std::strerror(errno));
  }
}

std::vector<Strategy> strategies_for(const Options& o, fiar::Backend b) {
  if (b == fiar::Backend::Nccl) return {Strategy::Auto};
  std::vector<Strategy> out;
  if (o.strategies.empty()) {
    out = {Strategy::OneShot, Strategy::TwoShot, Strategy::Auto};
    if (b == fiar::Backend::Mnnvl) out.insert(out.begin() + 2, Strategy::Multimem);
    return out;
  }
  // The in-switch reduction exists on mnnvl only: other backends leave those rows out.
  for (Strategy s : o.strategies) {
    if (s != Strategy::Multimem || b == fiar::Backend::Mnnvl) out.push_back(s);
  }
  return out;
}

// WorkspaceConfig::nccl_min_bytes of a run: the flag's, else (nccl rows on trtllm / mnnvl) the largest row's bytes so
// that the route exists, else the table's.
std::optional<std::size_t> nccl_min_bytes_for(const Options& o, fiar::Backend b, std::size_t largest_bytes) {
  if (o.nccl_min_bytes || b == fiar::Backend::Nccl) return o.nccl_min_bytes;
  const auto rows = strategies_for(o, b);
  if (std::find(rows.begin(), rows.end(), Strategy::Nccl) != rows.end()) return largest_bytes;
  return std::nullopt;
}

// The backends of the run: the requested ones resolved against the topology (auto: fiar's choice), plus the nccl
// baseline when none was requested and NCCL can run.
std::vector<fiar::Backend> backends_for(const Options& o, const fiar::Topology& topo, bool nccl_can_run) {
  std::vector<fiar::Backend> out;
  auto add = [&](fiar::Backend b) {
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  };
  if (o.backends.empty()) {
    add(fiar::resolve_backend(fiar::Backend::Auto, topo).backend);
    if (nccl_can_run) add(fiar::Backend::Nccl);
  } else {
    for (fiar::Backend b : o.backends) add(fiar::resolve_backend(b, topo).backend);
  }
  return out;
}

// ---- --plan: the launch of every row, from fiar's own shape and strategy functions ----

template <class T>
int plan(const Options& o, const fiar::Topology& topo) {
  const int world = topo.world_size;
  const int max_blocks = std::max(1, o.sms / o.ranks_per_gpu);
  std::vector<Row> rows;
  std::printf(
      "# fiar-bench %s --plan: %d rank(s), %s, %d SMs per GPU, %d rank(s) per GPU (at most %d blocks per "
      "launch)\n",
      fiar::version_string, world, fiar::arch_name(topo.arch).c_str(), o.sms, o.ranks_per_gpu, max_blocks);
  std::printf("#%12s %7s %7s %6s %-29s %-7s %-8s %-8s %-28s %7s %8s %8s\n", "size(B)", "tokens", "hidden", "dtype",
              "pattern", "backend", "strategy", "ran", "kernel", "blocks", "threads", "cluster");
  const std::vector<Point> pts = points<T>(o, false);
  for (fiar::Backend b : backends_for(o, topo, true)) {
    for (Pattern p : o.patterns) {
      for (const Point& pt : pts) {
        const int vecs = static_cast<int>(static_cast<long long>(pt.hidden) * sizeof(T) / 16);
        const std::size_t bytes = static_cast<std::size_t>(pt.tokens) * pt.hidden * sizeof(T);
        // The row of the strategy table the run's workspace resolves (its largest call decides the route).
        std::size_t largest = 0;
        for (const Point& q : pts) {
          if (q.hidden == pt.hidden) largest = std::max(largest, std::size_t(q.tokens) * q.hidden * sizeof(T));
        }
        fiar::WorkspaceConfig cfg;
        cfg.nccl_min_bytes = nccl_min_bytes_for(o, b, largest);
        const fiar::StrategyThresholds row = fiar::strategy_thresholds(b, topo, cfg);
        const bool route = world > 1 && row.nccl_min_bytes <= largest;
        for (Strategy s : strategies_for(o, b)) {
          Row r;
          r.size_bytes = static_cast<long long>(bytes);
          r.tokens = pt.tokens;
          r.hidden = pt.hidden;
          r.dtype = std::string(fiar::dtype_name<T>());
          r.pattern = fiar::to_string(p);
          r.backend = std::string(fiar::to_string(b));
          r.strategy = std::string(fiar::to_string(s));
          const fiar::CudaLaunchShape shape = fiar::CudaPlatform::launch_shape(pt.tokens, vecs, max_blocks);
          if (b == fiar::Backend::Nccl) {
            r.ran = "nccl";
            r.kernel = p == Pattern::AllReduce ? "ncclAllReduce only" : "ncclAllReduce + epilogue";
            if (p != Pattern::AllReduce) {
              r.blocks = shape.blocks;
              r.threads = shape.threads;
              r.cluster = shape.cluster;
            }
          } else {
            const Strategy ran = s != Strategy::Auto ? s
                                                     : fiar::choose_strategy(row, world, pt.tokens, bytes,
                                                                             b == fiar::Backend::Mnnvl, route);
            r.ran = std::string(fiar::to_string(ran));
            if (ran == Strategy::Nccl) {
              r.kernel = p == Pattern::AllReduce ? "ncclAllReduce only" : "ncclAllReduce + epilogue";
            } else {
              r.kernel = r.backend + " " + r.ran;
            }
            if (ran != Strategy::Nccl || p != Pattern::AllReduce) {
              r.blocks = shape.blocks;
              r.threads = shape.threads;
              r.cluster = shape.cluster;
            }
          }
          std::printf(" %12lld %7d %7d %6s %-29s %-7s %-8s %-8s %-28s %7d %8d %8d\n", r.size_bytes, r.tokens, r.hidden,
                      r.dtype.c_str(), r.pattern.c_str(), r.backend.c_str(), r.strategy.c_str(), r.ran.c_str(),
                      r.kernel.c_str(), r.blocks, r.threads, r.cluster);
          rows.push_back(r);
        }
      }
    }
  }
  write_outputs(o, rows, "plan", world, o.ranks_per_gpu > 1);
  return kExitOk;
}

// ---- running ----

// Per-iteration times of every rank for one row, in microseconds: [rank][iteration].
using Times = std::vector<std::vector<double>>;

// A percentile of sorted values (nearest rank).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

// What one rank does for one row: allocate the pattern's tensors, warm up, time, then check the outputs.
template <Pattern P, class T, class Platform>
void run_row_on_rank(fiar::AnyWorkspace<T, Platform>& ws, fiar::InProcessBootstrap& boot, const Options& o,
                     const fiar::Topology& topo, const Point& pt, Strategy strategy, Memory& mem, int iterations,
                     int warmup, std::vector<double>& times, Check& check, Strategy& ran) {
  CallTensors<P, T> tensors(mem, pt.tokens, pt.hidden);
  tensors.set_inputs(mem, topo.rank, 0);
  mem.sync();
  const auto call = [&] { ws.template run<P>(tensors.a, mem.stream(), strategy); };
  for (int i = 0; i < warmup; ++i) call();
  mem.sync();
  ws.check();
  times.assign(static_cast<std::size_t>(iterations), 0.0);
  if constexpr (std::is_same_v<Platform, fiar::HostPlatform>) {
    for (int i = 0; i < iterations; ++i) {
      boot.barrier();  // every rank starts the call together: the time is the call's, not a peer's lateness
      const auto start = std::chrono::steady_clock::now();
      call();
      times[static_cast<std::size_t>(i)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    }
  } else {
    cudaStream_t stream = mem.stream();
    auto ok = [](cudaError_t e, const char* what) {
      if (e != cudaSuccess)
        throw std::runtime_error(std::string("fiar-bench: ") + what + ": " + fiar_cli::describe_cuda(e));
    };
    std::vector<cudaEvent_t> events(static_cast<std::size_t>(iterations) + 1);
    for (auto& e : events) ok(cudaEventCreate(&e), "cudaEventCreate");
    cudaGraphExec_t exec = nullptr;
    cudaGraph_t graph = nullptr;
    if (o.graph_calls > 0) {
      ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      for (int c = 0; c < o.graph_calls; ++c) call();
      ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (warm-up)");
      ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    boot.barrier();
    ok(cudaEventRecord(events[0], stream), "cudaEventRecord");
    for (int i = 0; i < iterations; ++i) {
      if (exec != nullptr) {
        ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      } else {
        call();
      }
      ok(cudaEventRecord(events[static_cast<std::size_t>(i) + 1], stream), "cudaEventRecord");
    }
    ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (int i = 0; i < iterations; ++i) {
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, events[static_cast<std::size_t>(i)], events[static_cast<std::size_t>(i) + 1]),
         "cudaEventElapsedTime");
      times[static_cast<std::size_t>(i)] = 1000.0 * ms / std::max(1, o.graph_calls);
    }
    for (auto& e : events) (void)cudaEventDestroy(e);
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  ws.check();
  ran = ws.last_strategy();

  // Every row's outputs, on every rank, against the reference (the inputs are the same on every call).
  tensors.check(mem, topo.world_size, 0, check);
}

template <class T, class Platform>
void run_row_dispatch(Pattern p, fiar::AnyWorkspace<T, Platform>& ws, fiar::InProcessBootstrap& boot, const Options& o,
                      const fiar::Topology& topo, const Point& pt, Strategy s, Memory& mem, int iterations, int warmup,
                      std::vector<double>& times, Check& check, Strategy& ran) {
#define FIAR_BENCH_PATTERN_CASE(Unused, Q)                                                                           \
  case Pattern::Q:                                                                                                   \
    return run_row_on_rank<Pattern::Q, T, Platform>(ws, boot, o, topo, pt, s, mem, iterations, warmup, times, check, \
                                                    ran);
  switch (p) { FIAR_FOR_EACH_PATTERN(FIAR_BENCH_PATTERN_CASE, ) }
#undef FIAR_BENCH_PATTERN_CASE
}

// Runs every row of one backend on every rank (one thread per rank, one workspace per rank for the whole sweep).
template <class T, class Platform>
void run_backend(const Options& o, const fiar::Topology& topo, fiar::Backend backend, const std::vector<Point>& pts,
                 int gpus, int iterations, int warmup, std::vector<Row>& rows) {
  const int world = topo.world_size;
  // Points of different hidden sizes get a workspace each.
  std::vector<int> hiddens;
  for (const Point& pt : pts) {
    if (std::find(hiddens.begin(), hiddens.end(), pt.hidden) == hiddens.end()) hiddens.push_back(pt.hidden);
  }
  struct Job {
    Pattern pattern;
    Point point;
    Strategy strategy;
  };
  for (int hidden : hiddens) {
    std::vector<Job> jobs;
    int tokens_here = 1;
    for (Pattern p : o.patterns) {
      for (const Point& pt : pts) {
        if (pt.hidden != hidden) continue;
        tokens_here = std::max(tokens_here, pt.tokens);
        for (Strategy s : strategies_for(o, backend)) jobs.push_back({p, pt, s});
      }
    }
    std::vector<Times> times(jobs.size(), Times(static_cast<std::size_t>(world)));
    std::vector<std::vector<Check>> checks(jobs.size(), std::vector<Check>(static_cast<std::size_t>(world)));
    std::vector<Strategy> ran(jobs.size(), Strategy::Auto);
    std::vector<std::string> failures(static_cast<std::size_t>(world));
    bool nccl_symmetric = false;    // written by rank 0's thread before the join
    std::size_t symmetric_max = 0;  // the nccl workspace's window bound (calls above it run in place)
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = tokens_here;
    cfg.hidden_dim = hidden;
    cfg.oneshot_at_max_tokens = true;  // forced one-shot rows at every size
    cfg.verify_calls = o.verify_calls;
    cfg.nccl_min_bytes = nccl_min_bytes_for(o, backend, static_cast<std::size_t>(tokens_here) * hidden * sizeof(T));
    fiar::InProcessGroup group(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto boot = group.bootstrap(r);
        fiar::Topology mine = topo;
        mine.rank = r;
        try {
          std::unique_ptr<Memory> mem;
          typename Platform::Options popts{};
          if constexpr (std::is_same_v<Platform, fiar::HostPlatform>) {
            popts.blocks = 4;
            popts.lanes = 8;
            popts.cluster = 2;
            popts.multicast = o.multicast;
            mem = std::make_unique<HostMemory>();
          } else {
            use_rank_device(r, gpus);
            mem = std::make_unique<DeviceMemory>(r);
          }
          auto ws = fiar::make_workspace<T, Platform>(boot, mine, cfg, backend, popts);
          if constexpr (std::is_same_v<Platform, fiar::CudaPlatform>) {
            // Which ncclAllReduce the nccl rows measure: NCCL's symmetric kernels or the classic ones.
            if (auto* n = ws.template get_if<fiar::NcclPolicy>(); n != nullptr && r == 0) {
              nccl_symmetric = n->nccl_symmetric();
              symmetric_max = n->strategy_thresholds().nccl_symmetric_max_bytes;
            }
          }
          for (std::size_t j = 0; j < jobs.size(); ++j) {
            Strategy got = Strategy::Auto;
            run_row_dispatch<T, Platform>(jobs[j].pattern, ws, boot, o, mine, jobs[j].point, jobs[j].strategy, *mem,
                                          iterations, warmup, times[j][static_cast<std::size_t>(r)],
                                          checks[j][static_cast<std::size_t>(r)], got);
            if (r == 0) ran[j] = got;
          }
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    std::string failure;
    for (int r = 0; r < world; ++r) {
      if (!failures[static_cast<std::size_t>(r)].empty() && failure.empty())
        failure = "rank " + std::to_string(r) + ": " + failures[static_cast<std::size_t>(r)];
    }
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      Row row;
      row.tokens = jobs[j].point.tokens;
      row.hidden = jobs[j].point.hidden;
      row.size_bytes = static_cast<long long>(row.tokens) * row.hidden * static_cast<long long>(sizeof(T));
      row.dtype = std::string(fiar::dtype_name<T>());
      row.pattern = fiar::to_string(jobs[j].pattern);
      row.backend = std::string(fiar::to_string(backend));
      row.strategy = std::string(fiar::to_string(jobs[j].strategy));
      row.ran = backend != fiar::Backend::Nccl ? std::string(fiar::to_string(ran[j]))
                : nccl_symmetric && static_cast<std::size_t>(row.size_bytes) <= symmetric_max ? "nccl-symmetric"
                                                                                              : "nccl";
      row.error = failure;
      // Per iteration the slowest rank; then median, p99, min, max over the iterations.
      std::vector<double> per_iteration;
      bool complete = failure.empty();
      for (int i = 0; i < iterations && complete; ++i) {
        double slowest = 0;
        for (int r = 0; r < world; ++r) {
          const auto& t = times[j][static_cast<std::size_t>(r)];
          if (t.size() != static_cast<std::size_t>(iterations)) {
            complete = false;
            break;
          }
          slowest = std::max(slowest, t[static_cast<std::size_t>(i)]);
        }
        per_iteration.push_back(slowest);
      }
      if (complete) {
        std::sort(per_iteration.begin(), per_iteration.end());
        row.time_us = percentile(per_iteration, 0.5);
        row.p99_us = percentile(per_iteration, 0.99);
        row.min_us = per_iteration.front();
        row.max_us = per_iteration.back();
        row.algbw = row.time_us > 0 ? static_cast<double>(row.size_bytes) / (row.time_us * 1e3) : 0;
        row.busbw = row.algbw * 2.0 * (world - 1) / world;
        for (const Check& c : checks[j]) row.wrong += c.mismatches;
      } else {
        row.wrong = -1;
        if (row.error.empty()) row.error = "not run";
      }
      rows.push_back(row);
      std::printf(" %12lld %7d %7d %6s %-29s %-7s %-8s %-8s %10.2f %10.2f %9.2f %9.2f %7ld%s\n", row.size_bytes,
                  row.tokens, row.hidden, row.dtype.c_str(), row.pattern.c_str(), row.backend.c_str(),
                  row.strategy.c_str(), row.ran.c_str(), row.time_us, row.p99_us, row.algbw, row.busbw, row.wrong,
                  row.error.empty() ? "" : ("  FAILED: " + row.error).c_str());
      std::fflush(stdout);
    }
  }
}

template <class T>
int run(const Options& o, const std::string& platform, int world, int gpus) {
  const fiar::Topology topo =
      platform == "cuda" ? discover_on_gpus(world, gpus).topology : flag_topology(world, o.nodes, o.multicast, o.arch);
  if (o.plan) return plan<T>(o, topo);
  const bool host = platform == "host";
  const bool shared_gpu = !host && world > gpus;
  // NCCL cannot put two ranks of one communicator on one GPU.
  const bool nccl_can_run = host || (!shared_gpu && fiar::built_with_nccl);
  const int iterations = o.iterations.value_or(host ? 5 : 20);
  const int warmup = o.warmup.value_or(host ? 1 : 5);
  if (host && o.graph_calls > 0) throw UsageError("-G (CUDA graphs) needs --platform cuda");
  std::printf("# fiar-bench %s: platform %s, %d rank(s)%s, topology %s\n", fiar::version_string, platform.c_str(),
              world,
              host         ? " (host emulator: results checked, times NOT representative)"
              : shared_gpu ? (" sharing " + std::to_string(gpus) +
                              " GPU(s): ranks share a GPU, times are not those of "
                              "one GPU per rank")
                                 .c_str()
                           : "",
              fiar::to_string(topo).c_str());
  std::printf(
      "# %d timed call(s) per row after %d warm-up call(s)%s; time: the slowest rank per call, median (p99); "
      "busbw = algbw x 2(W-1)/W; call digests %s\n",
      iterations, warmup,
      o.graph_calls > 0 ? (", " + std::to_string(o.graph_calls) + " calls per CUDA graph").c_str() : "",
      o.verify_calls ? "on" : "off");
  if (!nccl_can_run && o.backends.empty()) {
    std::printf("# no nccl baseline: %s\n",
                shared_gpu ? "NCCL cannot put two ranks of one communicator on one GPU" : "this build has no NCCL");
  }
  std::vector<fiar::Backend> backends;
  try {
    backends = backends_for(o, topo, nccl_can_run);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitRejected;
  }
  const std::vector<Point> pts = points<T>(o, host);
  int max_tokens = 1;
  for (const Point& pt : pts) max_tokens = std::max(max_tokens, pt.tokens);
  for (fiar::Backend b : backends) {
    for (const Point& pt : pts) {
      std::string e;
      fiar::with_policy(b, [&](auto p) {
        e = fiar::Workspace<typename decltype(p)::type, T, fiar::HostPlatform>::why_not(
            topo, fiar::WorkspaceConfig{.max_token_num = max_tokens, .hidden_dim = pt.hidden});
      });
      if (!e.empty()) {
        std::fprintf(stderr, "%s\n", e.c_str());
        return kExitRejected;
      }
    }
  }
  std::printf("#%12s %7s %7s %6s %-29s %-7s %-8s %-8s %10s %10s %9s %9s %7s\n", "size(B)", "tokens", "hidden", "dtype",
              "pattern", "backend", "strategy", "ran", "time(us)", "p99(us)", "algbw", "busbw", "#wrong");
  std::vector<Row> rows;
  for (fiar::Backend b : backends) {
    if (platform == "host") {
      run_backend<T, fiar::HostPlatform>(o, topo, b, pts, gpus, iterations, warmup, rows);
    } else {
      run_backend<T, fiar::CudaPlatform>(o, topo, b, pts, gpus, iterations, warmup, rows);
      if (b == fiar::Backend::Nccl && fiar::nccl_symmetric_available()) {
        // The classic baseline next to the symmetric rows: the same calls with the window turned off (rows "nccl").
        const char* before = std::getenv("FIAR_NCCL_SYMMETRIC");
        const std::string saved = before != nullptr ? before : "";
        ::setenv("FIAR_NCCL_SYMMETRIC", "0",
                 1);  // read by every rank's workspace at creation, in threads started later
        run_backend<T, fiar::CudaPlatform>(o, topo, b, pts, gpus, iterations, warmup, rows);
        if (before != nullptr) {
          ::setenv("FIAR_NCCL_SYMMETRIC", saved.c_str(), 1);
        } else {
          ::unsetenv("FIAR_NCCL_SYMMETRIC");
        }
      }
    }
  }
  write_outputs(o, rows, platform, world, shared_gpu);
  long wrong = 0;
  int failed = 0;
  for (const Row& r : rows) {
    if (r.wrong < 0 || !r.error.empty()) {
      ++failed;
    } else {
      wrong += r.wrong;
    }
  }
  std::printf("# %zu row(s), %d failed, %ld wrong element(s)\n", rows.size(), failed, wrong);
  return failed == 0 && wrong == 0 ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  fiar_cli::CommandLine cli("fiar-bench", kUsage);
  add_options(cli, o);
  if (const auto status = cli.parse(argc, argv, [&] { check_options(o); })) return *status;
  // --plan runs nothing: no GPU is looked for.
  const PlatformChoice choice = o.plan ? PlatformChoice{"host", 0, ""} : choose_platform("fiar-bench", o.platform);
  if (choice.platform.empty()) return kExitRejected;
  const std::string& platform = choice.platform;
  const int gpus = choice.gpus;
  const int world = o.world_size.value_or(platform == "cuda" ? gpus : 4);
  try {
    if (o.dtype == "float") return run<float>(o, platform, world, gpus);
    if (o.dtype == "half") return run<__half>(o, platform, world, gpus);
    return run<__nv_bfloat16>(o, platform, world, gpus);
  } catch (const UsageError& e) {
    return cli.usage_error(e.what());
  } catch (const std::exception& e) {
    return fiar_cli::exit_status_of("fiar-bench", e);
  }
}
