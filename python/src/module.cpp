// SPDX-License-Identifier: Apache-2.0
// fiar._fiar — the Python extension under fiar/__init__.py: a workspace over any DLPack tensors (numpy, torch, ...),
// created over a Python bootstrap (an object with FlashInfer's CommBackend shape: Get_rank, Get_size, allgather,
// barrier) or fiar's TCP bootstrap from the environment, and one call that runs a fiar pattern.
// Contract: every blocking wait (creation, a call on the host emulator) runs without the GIL, and a Python bootstrap
// retakes it only for its own calls; fiar's exceptions arrive as fiar.TimeoutError / fiar.MismatchError (the C++
// message unchanged), std::invalid_argument as ValueError; a tensor of the wrong kind raises TypeError / ValueError
// naming the Python argument before anything runs. The public Python API (FlashInfer's names) is fiar/__init__.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fiar/fiar.hpp>

#if !defined(FIAR_PYTHON_CUDA)
#define FIAR_PYTHON_CUDA 0
#endif
#if !defined(FIAR_PYTHON_CUDA_HEADERS)
#define FIAR_PYTHON_CUDA_HEADERS "toolkit"
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace nb = nanobind;

namespace {

// ---- bootstraps ----

// A bootstrap over a Python object with FlashInfer's CommBackend shape: Get_rank(), Get_size(), allgather(obj) ->
// one entry per rank in rank order, barrier(). Called from C++ without the GIL: each call takes it.
class PythonBootstrap {
 public:
  explicit PythonBootstrap(nb::object comm) : comm_(std::move(comm)) {
    rank_ = nb::cast<int>(comm_.attr("Get_rank")());
    size_ = nb::cast<int>(comm_.attr("Get_size")());
  }
  ~PythonBootstrap() {
    nb::gil_scoped_acquire gil;
    comm_.reset();
  }
  PythonBootstrap(const PythonBootstrap&) = delete;
  PythonBootstrap& operator=(const PythonBootstrap&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    nb::gil_scoped_acquire gil;
    nb::object gathered = comm_.attr("allgather")(nb::bytes(reinterpret_cast<const char*>(in.data()), in.size()));
    const std::size_t n = nb::len(gathered);
    if (n != static_cast<std::size_t>(size_) || out.size() != in.size() * n) {
      throw std::runtime_error("fiar: comm_backend.allgather returned " + std::to_string(n) +
                               " entries; expected one per rank (" + std::to_string(size_) + ")");
    }
    for (std::size_t r = 0; r < n; ++r) {
      nb::bytes b = nb::cast<nb::bytes>(gathered[r]);
      if (b.size() != in.size()) {
        throw std::runtime_error("fiar: comm_backend.allgather gave rank " + std::to_string(r) + " " +
                                 std::to_string(b.size()) + " bytes; every rank sent " + std::to_string(in.size()));
      }
      std::memcpy(out.data() + r * in.size(), b.c_str(), in.size());
    }
  }
  void barrier() {
    nb::gil_scoped_acquire gil;
    comm_.attr("barrier")();
  }

 private:
  nb::object comm_;
  int rank_ = 0, size_ = 1;
};

static_assert(fiar::Bootstrap<PythonBootstrap>);

// ---- tensors ----

enum class Kind { F32, F16, BF16, U8, I32 };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::F32: return "float32";
    case Kind::F16: return "float16";
    case Kind::BF16: return "bfloat16";
    case Kind::U8: return "uint8";
    case Kind::I32: return "int32";
  }
  return "?";
}

bool is_kind(const nb::dlpack::dtype& d, Kind k) {
  using nb::dlpack::dtype_code;
  switch (k) {
    case Kind::F32: return d.code == static_cast<std::uint8_t>(dtype_code::Float) && d.bits == 32 && d.lanes == 1;
    case Kind::F16: return d.code == static_cast<std::uint8_t>(dtype_code::Float) && d.bits == 16 && d.lanes == 1;
    case Kind::BF16: return d.code == static_cast<std::uint8_t>(dtype_code::Bfloat) && d.bits == 16 && d.lanes == 1;
    // FP8 codes arrive as uint8 or as a float8 dtype (torch.float8_e4m3fn: DLPack float8 codes): any 8-bit type.
    case Kind::U8: return d.bits == 8 && d.lanes == 1;
    case Kind::I32:
      return (d.code == static_cast<std::uint8_t>(dtype_code::Int) ||
              d.code == static_cast<std::uint8_t>(dtype_code::UInt)) &&
             d.bits == 32 && d.lanes == 1;
  }
  return false;
}

using Array = nb::ndarray<>;  // any DLPack tensor; its device is checked against the workspace's platform

// The address of a tensor argument after checking its kind, its row count and width (when given), and that it is
// row-major without gaps. `name` is the Python argument's.
struct TensorSpec {
  Kind kind;
  std::int64_t rows = -1;  ///< -1: any
  std::int64_t cols = -1;  ///< -1: any; 0: a 1-D tensor of `rows` elements (or rows x 1)
};

// Whether t is row-major without gaps (a dimension of one element may have any stride); `elements`: how many it holds.
bool row_major(const Array& t, std::size_t& elements) {
  bool dense = true;
  elements = 1;
  for (std::size_t d = t.ndim(); d-- > 0;) {
    if (t.shape(d) > 1 && t.stride(d) != static_cast<std::int64_t>(elements)) dense = false;
    elements *= t.shape(d);
  }
  return dense;
}

void* checked(const std::optional<Array>& a, const char* name, const TensorSpec& spec) {
  if (!a) return nullptr;
  const Array& t = *a;
  if (!is_kind(t.dtype(), spec.kind)) {
    throw nb::type_error((std::string(name) + " must be a " + kind_name(spec.kind) + " tensor (bits " +
                          std::to_string(t.dtype().bits) + ", code " + std::to_string(t.dtype().code) + " given)")
                             .c_str());
  }
  // Rows and columns of a 2-D tensor (a 1-D one is one row of shape(0) elements, or with cols == 0 a column).
  const std::size_t nd = t.ndim();
  std::int64_t rows = nd >= 1 ? static_cast<std::int64_t>(t.shape(0)) : 1;
  std::int64_t cols = nd >= 2 ? static_cast<std::int64_t>(t.shape(1)) : 1;
  if (nd == 0 && spec.cols == 0 && spec.rows == 1) return t.data();  // a scalar tensor (torch.tensor(0.05))
  if (nd > 2 || nd == 0) {
    throw nb::value_error(
        (std::string(name) + " must be 1-D or 2-D (it has " + std::to_string(nd) + " dimensions)").c_str());
  }
  if (spec.cols == 0) {  // a vector: [rows] or [rows, 1]
    if (nd == 2 && cols != 1) {
      throw nb::value_error((std::string(name) + " must have shape (" + std::to_string(spec.rows) + ", 1) or (" +
                             std::to_string(spec.rows) + ",); got a second dimension of " + std::to_string(cols))
                                .c_str());
    }
    cols = -1;
  }
  if ((spec.rows >= 0 && rows != spec.rows) || (spec.cols > 0 && cols != spec.cols)) {
    throw nb::value_error((std::string(name) + " has shape (" + std::to_string(rows) +
                           (nd == 2 ? ", " + std::to_string(t.shape(1)) : std::string()) + "); expected (" +
                           std::to_string(spec.rows) + (spec.cols > 0 ? ", " + std::to_string(spec.cols) : "") + ")")
                              .c_str());
  }
  std::size_t elements = 0;
  if (!row_major(t, elements)) throw nb::value_error((std::string(name) + " must be contiguous (row-major)").c_str());
  return t.data();
}

// A buffer fiar writes bytes into: contiguous, holding at least `need` bytes, whatever its shape. Without strict
// checks (flashinfer-compatible calls) of any element type, as FlashInfer takes one: its own tests pass a bf16 tensor
// as quant_out, vLLM an int32 scale buffer viewed as float8. `note` follows the byte count in the message.
void* checked_bytes(const Array& t, const char* name, std::size_t need, const char* what, const char* note = "") {
  std::size_t elements = 0;
  const bool contiguous = row_major(t, elements);
  const std::size_t size = elements * ((t.dtype().bits * t.dtype().lanes + 7u) / 8u);
  if (!contiguous || size < need) {
    throw nb::value_error((std::string(name) + " holds " + std::to_string(size) +
                           (contiguous ? "" : " non-contiguous") + " bytes; this call's " + what + " take " +
                           std::to_string(need) + " contiguous bytes" + note)
                              .c_str());
  }
  return t.data();
}

// The block-scale tensor (scale_out of NVFP4, MXFP8 and the per-token-group FP8 patterns), whose bytes fiar writes
// without knowing its size: its element type, and that its storage holds every byte of the pattern's layout (group
// scales: FlashInfer's strided [tokens, C] with strides (1, round_up(tokens, 4)), 4-byte elements). Settings fiar
// rejects itself (a group size, a layout) are left to its message.
void* checked_block_scales(const std::optional<Array>& a, fiar::Quant quant, std::int64_t tokens, std::int64_t hidden,
                           int group_size, int group_scale, int layout, bool strict) {
  if (!a) return nullptr;
  const Array& t = *a;
  const auto n = static_cast<int>(tokens), h = static_cast<int>(hidden);
  if (quant == fiar::Quant::Fp8Group) {
    const bool packed = group_scale == static_cast<int>(fiar::GroupScale::Ue8m0Packed);
    if (!is_kind(t.dtype(), packed ? Kind::I32 : Kind::F32)) {
      throw nb::type_error(packed ? "scale_out must be an int32 tensor (4 packed UE8M0 scales each)"
                                  : "scale_out must be a float32 tensor (the fp32 group scales)");
    }
    if (group_size <= 0 || hidden % group_size != 0 || !fiar::is_valid(static_cast<fiar::GroupScale>(group_scale))) {
      return t.data();
    }
    const int cols = fiar::algo::fp8_group_scale_cols(h, group_size, static_cast<fiar::GroupScale>(group_scale));
    const int rows = fiar::algo::fp8_group_scale_rows(n);
    const bool shape =
        t.ndim() == 2 && static_cast<std::int64_t>(t.shape(0)) == tokens && static_cast<int>(t.shape(1)) == cols;
    const bool strides = shape && (t.stride(0) == 1 || tokens == 1) && (t.stride(1) == rows || cols == 1);
    if (!strides) {
      throw nb::value_error(("scale_out must have shape (" + std::to_string(n) + ", " + std::to_string(cols) +
                             ") and strides (1, " + std::to_string(rows) +
                             ") in elements (torch.empty_strided((num_tokens, C), (1, round_up(num_tokens, 4))))")
                                .c_str());
    }
    return t.data();
  }
  if (quant == fiar::Quant::Nvfp4 || quant == fiar::Quant::Mxfp8) {
    if (strict && !is_kind(t.dtype(), Kind::U8)) {
      throw nb::type_error("scale_out must be an 8-bit tensor (uint8, float8)");
    }
    const auto l = static_cast<fiar::ScaleLayout>(layout);
    if (!fiar::is_valid(l)) return t.data();
    const std::size_t need =
        quant == fiar::Quant::Nvfp4 ? fiar::algo::nvfp4_scale_bytes(n, h, l) : fiar::algo::mxfp8_scale_bytes(n, h, l);
    return checked_bytes(t, "scale_out", need, "block scales", " (the layout's padded rows and columns included)");
  }
  return t.data();  // a pattern without block scales: fiar rejects the tensor as an output it does not write
}

// ---- workspaces ----

// The workspace of one element type on the host emulator, and (a CUDA build) on GPUs.
template <class T>
using HostWorkspace = fiar::AnyWorkspace<T, fiar::HostPlatform>;
#if FIAR_PYTHON_CUDA
template <class T>
using GpuWorkspace = fiar::AnyWorkspace<T, fiar::CudaPlatform>;
using AnyWorkspaceOf =
    std::variant<std::monostate, HostWorkspace<float>, HostWorkspace<__half>, HostWorkspace<__nv_bfloat16>,
                 GpuWorkspace<float>, GpuWorkspace<__half>, GpuWorkspace<__nv_bfloat16>>;
#else
using AnyWorkspaceOf =
    std::variant<std::monostate, HostWorkspace<float>, HostWorkspace<__half>, HostWorkspace<__nv_bfloat16>>;
#endif

Kind kind_of_dtype(const std::string& dtype) {
  if (dtype == "float32") return Kind::F32;
  if (dtype == "float16") return Kind::F16;
  if (dtype == "bfloat16") return Kind::BF16;
  throw nb::value_error(("dtype " + dtype + "; allowed: float32, float16, bfloat16").c_str());
}

// One call's arguments as the Python layer passes them (FlashInfer's argument names mapped to fiar's pattern).
struct CallArgs {
  int pattern = 0;
  int strategy = 0;
  std::uintptr_t stream = 0;  ///< CUDA: the stream to launch on (torch's current stream; 0: the default stream)
  std::optional<Array> input, output, residual_in, residual_out, gamma, gamma_pre, norm_out, quant_out, scale,
      scale_out, block_scale_out, expanded_idx, expert_scale, shared_expert_out;
  float eps = 1e-6f, weight_bias = 0.0f, routed_scaling_factor = 1.0f;
  int layout = 0, group_size = 128, group_scale = 0;
  bool strict = true;  ///< false: byte outputs (quant_out, block scales) of any element type, sized in bytes
};

class Workspace {
  // f(ws) on the workspace of the element type this one was created with (a destroyed one throws).
  template <class F>
  auto visit(F&& f) const {
    return std::visit(
        [&](const auto& ws) -> decltype(f(std::declval<const HostWorkspace<float>&>())) {
          if constexpr (std::is_same_v<std::decay_t<decltype(ws)>, std::monostate>) {
            throw std::logic_error("fiar: the workspace was destroyed. Fix: create another one.");
          } else {
            return f(ws);
          }
        },
        ws_);
  }

 public:
  Workspace(nb::object comm, const std::string& backend, int world_size, int rank, int max_token_num, int hidden_dim,
            const std::string& dtype, int gpus_per_node, bool force_oneshot, int timeout_ms, bool batch_invariant,
            int arch, const std::string& platform)
      : kind_(kind_of_dtype(dtype)), hidden_(hidden_dim), world_size_(world_size), cuda_(platform == "cuda") {
    fiar::WorkspaceConfig cfg;
    cfg.max_token_num = max_token_num;
    cfg.hidden_dim = hidden_dim;
    cfg.oneshot_at_max_tokens = force_oneshot;
    cfg.timeout = std::chrono::milliseconds(timeout_ms);
    cfg.batch_invariant = batch_invariant;
    const fiar::Backend requested = fiar::parse_backend(backend);
    if (gpus_per_node <= 0) gpus_per_node = world_size;
    if (world_size % gpus_per_node != 0) {
      throw nb::value_error(("gpus_per_node = " + std::to_string(gpus_per_node) + " does not divide world_size = " +
                             std::to_string(world_size) + ". Fix: pass the ranks per node.")
                                .c_str());
    }
    // The emulated machine: world_size / gpus_per_node nodes, each an NVSwitch domain with multicast.
    fiar::Topology topo{.world_size = world_size,
                        .rank = rank,
                        .node_count = world_size / gpus_per_node,
                        .multicast_supported = world_size == gpus_per_node,
                        .arch = arch};
    if (!comm.is_none()) {
      boot_ = std::make_unique<PythonBootstrap>(comm);
      if (boot_->rank() != rank || boot_->size() != world_size) {
        throw nb::value_error(("comm_backend says rank " + std::to_string(boot_->rank()) + " of " +
                               std::to_string(boot_->size()) + ", the call rank " + std::to_string(rank) + " of " +
                               std::to_string(world_size) + ". Fix: pass the comm_backend of this rank's group.")
                                  .c_str());
      }
    }
    nb::gil_scoped_release release;
    create(requested, topo, cfg);
  }

  [[nodiscard]] std::string platform() const { return cuda_ ? "cuda" : "host"; }
  [[nodiscard]] int device() const { return device_; }

  [[nodiscard]] std::string backend() const {
    return visit([](const auto& ws) { return std::string(fiar::to_string(ws.backend())); });
  }
  [[nodiscard]] int world_size() const {
    return visit([](const auto& ws) { return ws.topology().world_size; });
  }
  [[nodiscard]] int rank() const {
    return visit([](const auto& ws) { return ws.topology().rank; });
  }
  [[nodiscard]] std::string dtype() const { return kind_name(kind_); }
  [[nodiscard]] int hidden_dim() const { return hidden_; }
  [[nodiscard]] int max_token_num() const {
    return visit([](const auto& ws) { return ws.config().max_token_num; });
  }
  [[nodiscard]] bool fits(int num_tokens, int strategy) const {
    return visit([&](const auto& ws) {
      return ws.is_buffer_size_sufficient(num_tokens, static_cast<fiar::Strategy>(strategy));
    });
  }
  [[nodiscard]] std::string last_strategy() const {
    return visit([](const auto& ws) { return std::string(fiar::to_string(ws.last_strategy())); });
  }
  void check() const {
    nb::gil_scoped_release release;
    visit([](const auto& ws) { ws.check(); });
  }
  void destroy() {
    nb::gil_scoped_release release;
    ws_ = std::monostate{};
    boot_.reset();
  }
  [[nodiscard]] bool destroyed() const { return std::holds_alternative<std::monostate>(ws_); }

  // One call: `d` maps CallArgs' names to tensors (None or absent: not passed) and values.
  void run(const nb::dict& d) {
    CallArgs c;
    auto value = [&](const char* key, auto fallback) {
      using V = decltype(fallback);
      return d.contains(key) && !d[key].is_none() ? nb::cast<V>(d[key]) : fallback;
    };
    c.pattern = value("pattern", 0);
    c.strategy = value("strategy", 0);
    c.eps = value("eps", 1e-6f);
    c.weight_bias = value("weight_bias", 0.0f);
    c.routed_scaling_factor = value("routed_scaling_factor", 1.0f);
    c.layout = value("layout", 0);
    c.group_size = value("group_size", 128);
    c.group_scale = value("group_scale", 0);
    c.stream = value("stream", std::uintptr_t{0});
    c.strict = value("strict", true);
    // numpy arrays of ml_dtypes' bfloat16, which numpy cannot export through DLPack: the Python layer passes them as
    // uint16 views and names their keys here; they are relabelled bfloat16 (the same bits).
    std::vector<std::string> bf16_views;
    if (d.contains("bf16_views")) bf16_views = nb::cast<std::vector<std::string>>(d["bf16_views"]);
    auto tensor = [&](const char* key, const char* name, std::optional<Array>& into) {
      if (!d.contains(key) || d[key].is_none()) return;
      Array a;
      const bool cast = nb::try_cast<Array>(d[key], a, /*convert=*/false);
      const bool on_device = cast && (cuda_ ? a.device_type() == nb::device::cuda::value && a.device_id() == device_
                                            : a.device_type() == nb::device::cpu::value);
      if (!on_device) {
        const std::string want = cuda_ ? "a CUDA tensor on device " + std::to_string(device_) +
                                             " (platform='cuda': the workspace's GPU) supporting DLPack"
                                       : "a host tensor (numpy, or torch on the CPU: the host platform) supporting "
                                         "DLPack";
        throw nb::type_error((std::string(name) + " must be " + want + "; got " +
                              nb::cast<std::string>(nb::str(nb::handle(d[key]).type())))
                                 .c_str());
      }
      if (std::find(bf16_views.begin(), bf16_views.end(), key) != bf16_views.end() &&
          a.dtype() == nb::dtype<std::uint16_t>()) {
        std::vector<std::size_t> shape(a.ndim());
        std::vector<std::int64_t> strides(a.ndim());
        for (std::size_t i = 0; i < a.ndim(); ++i) {
          shape[i] = a.shape(i);
          strides[i] = a.stride(i);
        }
        const nb::dlpack::dtype bf16{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
        a = Array(a.data(), a.ndim(), shape.data(), d[key], strides.data(), bf16, a.device_type(), a.device_id());
      }
      into = a;
    };
    tensor("input", "input", c.input);
    tensor("output", "output", c.output);
    tensor("residual_in", "residual_in", c.residual_in);
    tensor("residual_out", "residual_out", c.residual_out);
    tensor("gamma", "rms_gamma", c.gamma);
    tensor("gamma_pre", "gamma_pre", c.gamma_pre);
    tensor("norm_out", "norm_out", c.norm_out);
    tensor("quant_out", "quant_out", c.quant_out);
    tensor("scale", "scale_factor", c.scale);
    tensor("scale_out", "scale_out", c.scale_out);
    tensor("block_scale_out", "scale_out", c.block_scale_out);
    tensor("expanded_idx", "expanded_idx_to_permuted_idx", c.expanded_idx);
    tensor("expert_scale", "expert_scale_factor", c.expert_scale);
    tensor("shared_expert_out", "shared_expert_output", c.shared_expert_out);
    std::visit(
        [&](auto& ws) {
          if constexpr (std::is_same_v<std::decay_t<decltype(ws)>, std::monostate>) {
            throw std::logic_error("fiar: the workspace was destroyed. Fix: create another one.");
          } else {
            run_typed(ws, c);
          }
        },
        ws_);
  }

 private:
  void create(fiar::Backend requested, const fiar::Topology& topo, const fiar::WorkspaceConfig& cfg) {
    auto make = [&](auto tag, auto& boot) {
      using T = typename decltype(tag)::type;
#if FIAR_PYTHON_CUDA
      if (cuda_) {
        // The calling thread's current device (torch.cuda.set_device) is the rank's GPU; the group discovers its
        // topology together (collective).
        fiar::detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice", "a CUDA device is visible here");
        const fiar::Topology found = fiar::discover_topology(boot);
        ws_ = fiar::make_workspace<T, fiar::CudaPlatform>(boot, found, cfg, requested, fiar::CudaPlatformOptions{});
        return;
      }
#endif
      ws_ = fiar::make_workspace<T, fiar::HostPlatform>(boot, topo, cfg, requested, fiar::HostPlatformOptions{});
    };
    auto with_boot = [&](auto tag) {
      if (boot_) {
        make(tag, *boot_);
      } else if (world_size_ == 1) {  // a group of one needs no rendezvous
        fiar::InProcessGroup group(1);
        auto alone = group.bootstrap(0);
        make(tag, alone);
      } else {
        fiar::TcpBootstrap tcp(fiar::TcpBootstrapOptions::from_environment(cfg.timeout));
        make(tag, tcp);
      }
    };
    switch (kind_) {
      case Kind::F32: with_boot(std::type_identity<float>{}); break;
      case Kind::F16: with_boot(std::type_identity<__half>{}); break;
      case Kind::BF16: with_boot(std::type_identity<__nv_bfloat16>{}); break;
      default: throw std::logic_error("fiar: unreachable dtype");
    }
  }

  template <class W>
  void run_typed(W& ws, const CallArgs& c) {
    using T = typename W::value_type;
    const fiar::Pattern p = static_cast<fiar::Pattern>(c.pattern);
    if (!fiar::is_valid(p)) throw nb::value_error(("pattern value " + std::to_string(c.pattern)).c_str());
    const fiar::PatternTraits& traits = fiar::pattern_traits(p);
    const bool moe = traits.prologue == fiar::Prologue::MoeFinalize;
    if (!c.input) throw nb::value_error("input is required");
    const std::int64_t in_rows = c.input->ndim() >= 1 ? static_cast<std::int64_t>(c.input->shape(0)) : 0;
    std::int64_t tokens = in_rows;
    if (moe) {
      if (!c.expanded_idx) throw nb::value_error("expanded_idx_to_permuted_idx is required by MoE finalize");
      tokens = static_cast<std::int64_t>(c.expanded_idx->shape(0));
    }
    const Kind k = kind_;
    const std::int64_t h = hidden_;
    fiar::FusedArgs<T> a;
    a.in = static_cast<const T*>(checked(c.input, "input", {k, in_rows, h}));
    a.num_tokens = static_cast<int>(tokens);
    a.out = static_cast<T*>(checked(c.output, "output", {k, tokens, h}));
    a.residual_in = static_cast<const T*>(checked(c.residual_in, "residual_in", {k, tokens, h}));
    a.residual_out = static_cast<T*>(checked(c.residual_out, "residual_out", {k, tokens, h}));
    a.gamma = static_cast<const T*>(checked(c.gamma, "rms_gamma", {k, h, 0}));
    a.gamma_pre = static_cast<const T*>(checked(c.gamma_pre, "gamma_pre", {k, h, 0}));
    a.norm_out = static_cast<T*>(checked(c.norm_out, "norm_out", {k, tokens, h}));
    // NVFP4 packs two codes a byte; the other quantizing patterns write one a byte.
    const std::int64_t code_bytes = traits.quant == fiar::Quant::Nvfp4 ? h / 2 : h;
    a.quant_out = c.strict || !c.quant_out
                      ? checked(c.quant_out, "quant_out", {Kind::U8, tokens, code_bytes})
                      : checked_bytes(*c.quant_out, "quant_out", static_cast<std::size_t>(tokens * code_bytes),
                                      "quantized codes");
    a.scale = static_cast<const float*>(checked(c.scale, "scale_factor", {Kind::F32, 1, 0}));
    a.scale_out = static_cast<float*>(checked(c.scale_out, "scale_out", {Kind::F32, tokens, 0}));
    a.block_scale_out = checked_block_scales(c.block_scale_out, traits.quant, tokens, h, c.group_size, c.group_scale,
                                             c.layout, c.strict);
    a.eps = c.eps;
    a.weight_bias = c.weight_bias;
    a.layout = static_cast<fiar::ScaleLayout>(c.layout);
    a.group_size = c.group_size;
    a.group_scale = static_cast<fiar::GroupScale>(c.group_scale);
    if (moe) {
      a.expanded_idx_to_permuted_idx =
          static_cast<const int*>(checked(c.expanded_idx, "expanded_idx_to_permuted_idx", {Kind::I32, tokens, -1}));
      a.top_k = c.expanded_idx->ndim() == 2 ? static_cast<int>(c.expanded_idx->shape(1)) : 1;
      a.expert_scale = static_cast<const float*>(
          checked(c.expert_scale, "expert_scale_factor", {Kind::F32, tokens, static_cast<std::int64_t>(a.top_k)}));
      a.shared_expert_out = static_cast<const T*>(checked(c.shared_expert_out, "shared_expert_output", {k, tokens, h}));
      a.num_permuted_rows = static_cast<int>(in_rows);
      a.routed_scaling_factor = c.routed_scaling_factor;
    }
    const auto strategy = static_cast<fiar::Strategy>(c.strategy);
    const auto stream = reinterpret_cast<cudaStream_t>(c.stream);
    nb::gil_scoped_release release;  // the call waits for the other ranks on the emulator
    switch (p) {
#define FIAR_PY_CASE(unused, P) \
  case fiar::Pattern::P: ws.template run<fiar::Pattern::P>(a, stream, strategy); break;
      FIAR_FOR_EACH_PATTERN(FIAR_PY_CASE, _)
#undef FIAR_PY_CASE
    }
  }

  Kind kind_;
  int hidden_;
  int world_size_;
  bool cuda_;
  int device_ = -1;  ///< CUDA: the GPU the workspace was created on
  std::unique_ptr<PythonBootstrap> boot_;
  AnyWorkspaceOf ws_;
};

// How `pattern` (a fiar::Pattern value) uses each of FusedArgs' tensors, by FusedArgs' names: "required", "optional"
// or "unused". The Python layer drops what a pattern does not use before anything is checked (as FlashInfer ignores
// it).
nb::dict tensor_uses(int pattern) {
  const auto p = static_cast<fiar::Pattern>(pattern);
  if (!fiar::is_valid(p)) throw nb::value_error(("pattern value " + std::to_string(pattern)).c_str());
  const fiar::PatternTraits& traits = fiar::pattern_traits(p);
  nb::dict uses;
  for (int i = 0; i < fiar::kFusedTensorCount; ++i) {
    const fiar::TensorUse u = traits.use[i];
    uses[fiar::kFusedTensorNames[i]] = u == fiar::TensorUse::Required   ? "required"
                                       : u == fiar::TensorUse::Optional ? "optional"
                                                                        : "unused";
  }
  return uses;
}

}  // namespace

NB_MODULE(_fiar, m) {
  m.doc() = "fiar's extension: use the fiar package (import fiar), not this module";
  m.attr("version") = fiar::version_string;
  m.attr("cuda") = static_cast<bool>(FIAR_PYTHON_CUDA);
  m.attr("nccl") = static_cast<bool>(FIAR_HAS_NCCL);  // the nccl backend and route on GPUs (CUDA builds with NCCL)
  m.attr("cuda_headers") = FIAR_PYTHON_CUDA_HEADERS;  // where the build's CUDA headers came from: "wheels", "toolkit"
  m.def("tensor_uses", &tensor_uses, nb::arg("pattern"));
  nb::exception<fiar::timeout_error>(m, "TimeoutError", PyExc_TimeoutError);
  nb::exception<fiar::mismatch_error>(m, "MismatchError", PyExc_RuntimeError);

  nb::class_<Workspace>(m, "Workspace")
      .def(nb::init<nb::object, const std::string&, int, int, int, int, const std::string&, int, bool, int, bool, int,
                    const std::string&>(),
           nb::arg("comm").none(), nb::arg("backend"), nb::arg("world_size"), nb::arg("rank"), nb::arg("max_token_num"),
           nb::arg("hidden_dim"), nb::arg("dtype"), nb::arg("gpus_per_node"), nb::arg("force_oneshot"),
           nb::arg("timeout_ms"), nb::arg("batch_invariant"), nb::arg("arch"), nb::arg("platform"))
      .def_prop_ro("platform", &Workspace::platform)
      .def_prop_ro("device", &Workspace::device)
      .def_prop_ro("backend", &Workspace::backend)
      .def_prop_ro("world_size", &Workspace::world_size)
      .def_prop_ro("rank", &Workspace::rank)
      .def_prop_ro("dtype", &Workspace::dtype)
      .def_prop_ro("hidden_dim", &Workspace::hidden_dim)
      .def_prop_ro("max_token_num", &Workspace::max_token_num)
      .def_prop_ro("destroyed", &Workspace::destroyed)
      .def_prop_ro("last_strategy", &Workspace::last_strategy)
      .def("fits", &Workspace::fits)
      .def("check", &Workspace::check)
      .def("destroy", &Workspace::destroy)
      .def("run", &Workspace::run);
}
