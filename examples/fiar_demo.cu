// fiar-demo — runs real all-reduces through fiar and verifies every rank's result against an independent
// reference: on the GPU (one thread per rank, each with its own stream) or on the host emulator.
// Exit status: 0 every iteration on every rank matched, 1 a mismatch or failure, 2 the configuration is
// rejected (the std::invalid_argument message on stderr; nothing run).
#include <fiar/fiar.cuh>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitRejected = 2;

constexpr const char* kUsage = R"(usage: fiar-demo [options]

  --platform host|cuda      where to run (default: cuda when a usable GPU exists, else host)
  --backend NAME            auto, trtllm, mnnvl or nccl (default: $FIAR_ALLREDUCE_BACKEND, else auto)
  --world-size N            ranks (default: GPUs present, else 4); on cuda, ranks beyond the GPU count
                            share GPUs (several ranks per GPU)
  --nodes N                 nodes the host emulator reports (default 1)
  --multicast yes|no        NVLink multicast the host emulator reports (default no)
  --arch sm_90|sm_100       architecture the host emulator reports (default sm_90)
  --dtype float|half|bf16   element type (default bf16)
  --tokens N                tokens per call (default 16)
  --hidden N                hidden size (default 4096)
  --iterations N            calls per rank (default 10)
  --strategy auto|oneshot|twoshot   (default auto)
  --pattern allreduce       what each call computes (fused patterns come later)
  -h, --help

exit status: 0 all results matched, 1 mismatch or failure, 2 configuration rejected
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string platform;  // "" = choose
  std::optional<fiar::Backend> backend;
  std::optional<int> world_size;
  int nodes = 1;
  bool multicast = false;
  int arch = 90;
  std::string dtype = "bf16";
  int tokens = 16;
  int hidden = 4096;
  int iterations = 10;
  fiar::Strategy strategy = fiar::Strategy::Auto;
};

int parse_int(std::string_view flag, std::string_view text, int min) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min) {
    throw UsageError(std::string(flag) + " " + fiar::detail::quoted(text) + ": expected an integer >= " +
                     std::to_string(min));
  }
  return v;
}

template <class... Choices>
std::string parse_choice(std::string_view flag, std::string_view text, Choices... choices) {
  for (std::string_view c : {std::string_view(choices)...}) {
    if (text == c) return std::string(text);
  }
  std::string list;
  for (std::string_view c : {std::string_view(choices)...}) list += (list.empty() ? "" : ", ") + std::string(c);
  throw UsageError(std::string(flag) + " " + fiar::detail::quoted(text) + ": expected one of " + list);
}

bool usable_gpu(int& count, std::string& why) {
  count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    why = e != cudaSuccess ? fiar::detail::describe_cuda(e) : "no CUDA device found";
    (void)cudaGetLastError();
    count = 0;
    return false;
  }
  return true;
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help = true;
      continue;
    }
    std::string value;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(arg.rfind("--", 0) == 0 ? arg + " needs a value" : "unexpected argument " + fiar::detail::quoted(arg));
    }
    if (arg == "--platform") {
      o.platform = parse_choice(arg, value, "host", "cuda");
    } else if (arg == "--backend") {
      o.backend = fiar::parse_backend(value);
    } else if (arg == "--world-size") {
      o.world_size = parse_int(arg, value, 1);
    } else if (arg == "--nodes") {
      o.nodes = parse_int(arg, value, 1);
    } else if (arg == "--multicast") {
      o.multicast = parse_choice(arg, value, "yes", "no") == "yes";
    } else if (arg == "--arch") {
      o.arch = parse_choice(arg, value, "sm_90", "sm_100") == "sm_90" ? 90 : 100;
    } else if (arg == "--dtype") {
      o.dtype = parse_choice(arg, value, "float", "half", "bf16");
    } else if (arg == "--tokens") {
      o.tokens = parse_int(arg, value, 1);
    } else if (arg == "--hidden") {
      o.hidden = parse_int(arg, value, 1);
    } else if (arg == "--iterations") {
      o.iterations = parse_int(arg, value, 1);
    } else if (arg == "--strategy") {
      const std::string s = parse_choice(arg, value, "auto", "oneshot", "twoshot");
      o.strategy = s == "oneshot" ? fiar::Strategy::OneShot : s == "twoshot" ? fiar::Strategy::TwoShot : fiar::Strategy::Auto;
    } else if (arg == "--pattern") {
      parse_choice(arg, value, "allreduce");
    } else {
      throw UsageError("unknown option " + fiar::detail::quoted(arg));
    }
  }
  return o;
}

// ---- the independent reference: fp64 sums of the same inputs, and the documented error bound ----

// Input element i of rank r at iteration it: a deterministic mix of magnitudes and signs, zeros included.
float input_value(int r, int it, std::size_t i) {
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(r * 40503 + it * 9973);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  if (h % 97 == 0) return (h & 1) ? -0.0f : 0.0f;
  const float unit = static_cast<float>(h % 20001) / 10000.0f - 1.0f;  // [-1, 1]
  return unit * std::ldexp(1.0f, static_cast<int>((h >> 20) % 6) - 2);
}

template <class T>
double unit_roundoff() {
  return std::is_same_v<T, float> ? std::ldexp(1.0, -24) : std::is_same_v<T, __half> ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

struct RankResult {
  long mismatches = 0;
  double max_error = 0;
  std::vector<unsigned char> last_bytes;  // the last output, to compare across ranks
  std::string error;
};

template <class T>
void verify(const std::vector<T>& out, int world, int it, RankResult& res) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < world; ++r) {
      const double x = static_cast<double>(fiar::detail::to_float(fiar::detail::from_float<T>(input_value(r, it, i))));
      exact += x;
      abs_sum += std::fabs(x);
    }
    const double got = static_cast<double>(fiar::detail::to_float(out[i]));
    const double err = std::fabs(got - exact);
    const double bound = unit_roundoff<T>() * std::fabs(exact) + (world - 1) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
    if (!(err <= bound * (1 + 1e-6))) ++res.mismatches;
    res.max_error = std::max(res.max_error, err);
  }
}

// Sized for the shape the demo runs; a forced one-shot needs buffers for one-shot at every token count.
fiar::WorkspaceConfig demo_config(const Options& o) {
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = o.tokens;
  cfg.hidden_dim = o.hidden;
  cfg.oneshot_at_max_tokens = o.strategy == fiar::Strategy::OneShot;
  return cfg;
}

template <class T, class Platform, class MakeBuffers>
RankResult run_rank(fiar::InProcessBootstrap& boot, const fiar::Topology& topo, const Options& o,
                    const typename Platform::Options& popts, MakeBuffers&& buffers) {
  RankResult res;
  fiar::Workspace<fiar::TrtllmPolicy, T, Platform> ws(boot, topo, demo_config(o), popts);
  const std::size_t count = static_cast<std::size_t>(o.tokens) * o.hidden;
  std::vector<T> host_in(count), host_out(count);
  auto [dev_in, dev_out, stream, upload, download, sync] = buffers(count);
  for (int it = 0; it < o.iterations; ++it) {
    for (std::size_t i = 0; i < count; ++i) host_in[i] = fiar::detail::from_float<T>(input_value(topo.rank, it, i));
    upload(host_in);
    ws.allreduce(dev_in, dev_out, o.tokens, stream, o.strategy);
    sync();
    ws.check();
    download(host_out);
    verify<T>(host_out, topo.world_size, it, res);
  }
  res.last_bytes.resize(count * sizeof(T));
  std::memcpy(res.last_bytes.data(), static_cast<const void*>(host_out.data()), res.last_bytes.size());
  return res;
}

template <class T>
int run(const Options& o, const std::string& platform, int world, int gpus, fiar::Backend requested) {
  // The topology: reported by flags on the host emulator, discovered on the GPUs.
  fiar::Topology topo;
  topo.world_size = world;
  topo.node_count = o.nodes;
  topo.multicast_supported = o.multicast;
  topo.fabric_handles_supported = o.multicast && o.nodes > 1;
  topo.arch = o.arch;
  std::vector<std::string> notes;
  if (platform == "cuda") {
    fiar::InProcessGroup probe_group(world);
    std::vector<fiar::DiscoveryReport> reports(static_cast<std::size_t>(world));
    std::vector<std::string> failures(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        try {
          (void)cudaSetDevice(r % gpus);
          auto boot = probe_group.bootstrap(r);
          reports[static_cast<std::size_t>(r)] = fiar::discover_topology_report(boot);
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& f : failures) {
      if (!f.empty()) throw std::runtime_error("topology discovery failed: " + f);
    }
    topo = reports[0].topology;
    notes = reports[0].notes;
  }
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
  fiar::Backend backend = res.backend;
  std::string why = requested == fiar::Backend::Auto ? "auto" : "requested";
  if (requested == fiar::Backend::Auto && backend != fiar::Backend::Trtllm) {
    for (fiar::Backend b : {fiar::Backend::Mnnvl, fiar::Backend::Trtllm}) {
      if (b == backend) break;
      why += "; " + std::string(fiar::to_string(b)) + " cannot run: " + fiar::why_not(b, topo);
    }
  }
  if (backend != fiar::Backend::Trtllm) {
    // This version implements the trtllm backend; mnnvl and nccl workspaces come with the next release.
    if (res.allow_trtllm_fallback) {
      std::printf("backend: %s chosen (%s), but this fiar version has no %s workspace yet: falling back to trtllm, "
                  "as the resolution allows on one node\n",
                  std::string(fiar::to_string(backend)).c_str(), why.c_str(), std::string(fiar::to_string(backend)).c_str());
      backend = fiar::Backend::Trtllm;
    } else {
      std::printf("backend: %s (%s)\n", std::string(fiar::to_string(backend)).c_str(), why.c_str());
      const bool trtllm_possible = fiar::can_run_on(fiar::Backend::Trtllm, topo);
      std::fprintf(stderr, "fiar-demo: the %s backend is not available in fiar %s yet (this version runs trtllm). %s\n",
                   std::string(fiar::to_string(backend)).c_str(), fiar::version_string,
                   trtllm_possible ? "Fix: pass --backend trtllm, which can run on this topology."
                                   : ("Fix: demonstrate on a topology trtllm can run on (one node, peer access, at most "
                                      "16 ranks); here trtllm cannot run: " + fiar::why_not(fiar::Backend::Trtllm, topo) + ".")
                                         .c_str());
      return kExitRejected;
    }
  } else {
    std::printf("backend: trtllm (%s)\n", why.c_str());
  }
  if (std::string e = fiar::Workspace<fiar::TrtllmPolicy, T, fiar::HostPlatform>::why_not(topo, demo_config(o));
      !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return kExitRejected;
  }

  std::vector<RankResult> results(static_cast<std::size_t>(world));
  fiar::InProcessGroup group(world);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  fiar::Strategy strategy_ran = fiar::Strategy::Auto;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto& out = results[static_cast<std::size_t>(r)];
      fiar::Topology mine = topo;
      mine.rank = r;
      auto boot = group.bootstrap(r);
      try {
        if (platform == "host") {
          auto buffers = [](std::size_t count) {
            auto in = std::make_shared<std::vector<T>>(count);
            auto outv = std::make_shared<std::vector<T>>(count);
            return std::make_tuple(in->data(), outv->data(), cudaStream_t{nullptr},
                                   [in](const std::vector<T>& h) { *in = h; },
                                   [outv](std::vector<T>& h) { h = *outv; }, [] {});
          };
          out = run_rank<T, fiar::HostPlatform>(boot, mine, o, fiar::HostPlatformOptions{}, buffers);
        } else {
          if (const cudaError_t e = cudaSetDevice(r % gpus); e != cudaSuccess) {
            throw std::runtime_error("fiar-demo: cudaSetDevice(" + std::to_string(r % gpus) + ") on rank " +
                                     std::to_string(r) + ": " + fiar::detail::describe_cuda(e));
          }
          T* d_in = nullptr;
          T* d_out = nullptr;
          cudaStream_t stream = nullptr;
          const std::size_t bytes = static_cast<std::size_t>(o.tokens) * o.hidden * sizeof(T);
          if (cudaMalloc(&d_in, bytes) != cudaSuccess || cudaMalloc(&d_out, bytes) != cudaSuccess ||
              cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
            const cudaError_t e = cudaGetLastError();
            throw std::runtime_error("fiar-demo: cudaMalloc / cudaStreamCreate failed on rank " + std::to_string(r) +
                                     ": " + fiar::detail::describe_cuda(e) + ". Check free GPU memory (nvidia-smi).");
          }
          auto buffers = [&](std::size_t) {
            return std::make_tuple(
                d_in, d_out, stream,
                [&](const std::vector<T>& h) { cudaMemcpyAsync(d_in, h.data(), bytes, cudaMemcpyHostToDevice, stream); },
                [&](std::vector<T>& h) { cudaMemcpy(h.data(), d_out, bytes, cudaMemcpyDeviceToHost); },
                [&] { cudaStreamSynchronize(stream); });
          };
          out = run_rank<T, fiar::CudaPlatform>(boot, mine, o, fiar::CudaPlatformOptions{}, buffers);
          cudaFree(d_in);
          cudaFree(d_out);
          cudaStreamDestroy(stream);
        }
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    const std::size_t bytes = static_cast<std::size_t>(o.tokens) * o.hidden * sizeof(T);
    const std::size_t threshold = fiar::default_oneshot_max_bytes(topo.arch, world);
    strategy_ran = o.strategy != fiar::Strategy::Auto ? o.strategy : fiar::choose_strategy(world, o.tokens, bytes, threshold);
  }
  std::printf("shape: %d tokens x %d hidden, %s, %d iteration(s), strategy %s -> %s\n", o.tokens, o.hidden,
              std::string(fiar::dtype_name<T>()).c_str(), o.iterations, std::string(fiar::to_string(o.strategy)).c_str(),
              std::string(fiar::to_string(strategy_ran)).c_str());

  long mismatches = 0;
  double max_error = 0;
  int failed = 0;
  bool identical = true;
  for (int r = 0; r < world; ++r) {
    const auto& res_r = results[static_cast<std::size_t>(r)];
    if (!res_r.error.empty()) {
      std::fprintf(stderr, "rank %d failed: %s\n", r, res_r.error.c_str());
      ++failed;
      continue;
    }
    mismatches += res_r.mismatches;
    max_error = std::max(max_error, res_r.max_error);
    identical = identical && res_r.last_bytes == results[0].last_bytes;
  }
  const bool ok = failed == 0 && mismatches == 0 && identical;
  std::printf("fiar-demo: %s: %d rank(s) x %d iteration(s) on %s, %ld element(s) outside the bound, max |error| %.3g, "
              "ranks %s, %.2f s wall\n",
              ok ? "PASS" : "FAIL", world, o.iterations, platform.c_str(), mismatches, max_error,
              identical ? "bit-identical" : "DIFFER", seconds);
  return ok ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  fiar::Backend requested = fiar::Backend::Auto;
  bool help = false;
  try {
    o = parse(argc, argv, help);
    requested = o.backend ? *o.backend : fiar::backend_from_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fiar-demo: %s\n\n%s", e.what(), kUsage);
    return kExitRejected;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  int gpus = 0;
  std::string no_gpu;
  const bool have_gpu = usable_gpu(gpus, no_gpu);
  const std::string platform = o.platform.empty() ? (have_gpu ? "cuda" : "host") : o.platform;
  if (platform == "cuda" && !have_gpu) {
    std::fprintf(stderr, "fiar-demo: --platform cuda needs a usable CUDA device: %s. Fix: use --platform host.\n",
                 no_gpu.c_str());
    return kExitRejected;
  }
  const int world = o.world_size.value_or(platform == "cuda" ? gpus : 4);
  std::printf("fiar-demo %s: platform %s%s\n", fiar::version_string, platform.c_str(),
              platform == "host" ? (" (host emulator; " + (have_gpu ? std::string("a GPU is present") : "no usable GPU: " + no_gpu) + ")").c_str()
                                 : "");
  try {
    if (o.dtype == "float") return run<float>(o, platform, world, gpus, requested);
    if (o.dtype == "half") return run<__half>(o, platform, world, gpus, requested);
    return run<__nv_bfloat16>(o, platform, world, gpus, requested);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitRejected;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fiar-demo: %s\n", e.what());
    return kExitFailed;
  }
}
