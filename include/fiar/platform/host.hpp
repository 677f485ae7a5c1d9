// SPDX-License-Identifier: Apache-2.0
// fiar/platform/host.hpp — HostPlatform: the ranks of a group are threads of one process, or processes of one machine,
// and their "GPU memory" is host memory (POSIX shared memory across processes); operations run on the host emulator
// (exec/host.hpp).
// Contract: every operation runs unchanged on it (launch<Op>); launches are synchronous, or (Options::asynchronous)
// queued on their stream and run in order by the stream's worker as on a GPU (streams, events and captured sequences:
// platform/host_stream.hpp); it needs no GPU and no driver; its collective setup steps fail on every rank alike
// (comm/agree.hpp).
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/bootstrap.hpp"
#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "../exec/atomics.hpp"
#include "../exec/context.hpp"
#include "../exec/host.hpp"
#include "../exec/operation.hpp"
#include "../runtime/posix.hpp"
#include "host_stream.hpp"
#include "region.hpp"

FIAR_BEGIN_NAMESPACE

/// The emulated grid of every launch: keep it small, each lane is a thread.
struct HostPlatformOptions {
  int blocks = 2;
  int lanes = 8;
  /// Blocks per emulated thread-block cluster (1 to 8, dividing `blocks`): a token's vectors are spread over the
  /// blocks of one cluster, as on the GPU at few tokens.
  int cluster = 1;
  /// Whether the emulated machine has NVLink multicast. false: allocate_multicast fails as it does on a
  /// machine without NVSwitch multicast (fiar::multicast_error on every rank), to exercise the fallback.
  bool multicast = true;
  /// GPU stream semantics: a launch is queued on its stream and returns at once; each stream (nullptr: the platform's
  /// own; others from create_stream) runs its launches in order on a worker of its own; synchronize() waits for the
  /// platform's streams. false: every launch has finished when it returns.
  bool asynchronous = false;
  /// Counts every kernel access per memory space (access_counts()); slows the emulator down.
  bool count_accesses = false;
  /// Test hook: called by every lane at the start of every launch of this platform, before the kernel (to make a rank
  /// slow, or some of its lanes); null: nothing.
  void (*lane_start)(void* arg, int block, int lane) = nullptr;
  void* lane_start_arg = nullptr;
};

/// Runs fiar's kernels on the CPU, with the ranks as threads of this process (see docs/design.md).
class HostPlatform {
 public:
  using Options = HostPlatformOptions;

  static constexpr const char* name = "host";
  /// Launches may return finished (always, unless Options::asynchronous): the workspace reads the error record right
  /// after each launch.
  static constexpr bool synchronous = true;

  /// A bad grid is reported by the first collective (allocate_shared) on every rank alike, so that one
  /// rank's mistake cannot leave its peers waiting.
  explicit HostPlatform(const Options& options = {}) : options_(options) {
    if (options.count_accesses) counter_ = std::make_unique<exec::AccessCounter>();
    init_ = detail::attempt([&] {
      grid_ = std::make_unique<exec::HostGrid>(options.blocks, options.lanes, options.cluster, counter_.get());
    });
  }
  HostPlatform(HostPlatform&&) noexcept = default;
  HostPlatform& operator=(HostPlatform&&) noexcept = default;
  /// Lets every queued launch finish first (the memory they use is this platform's).
  ~HostPlatform() { drain(); }

  /// Collective: allocates `bytes` of rank-visible memory per rank (zero-filled) and returns, in rank
  /// order, where each rank's block is seen from this rank. The ranks may be threads of one process (plain host
  /// memory) or processes of one machine (a POSIX shared-memory segment per rank, mapped by every rank; its name is
  /// removed as soon as every rank has mapped it, so nothing outlives the processes). Every rank co-owns every
  /// block, so a rank that leaves early (or fails, or dies) cannot free memory its peers may still write into.
  template <Bootstrap B>
  std::vector<std::uint32_t*> allocate_shared(B& boot, std::size_t bytes) {
    const auto processes =
        detail::agree(boot, init_, detail::this_process(), "HostPlatform setup failed on rank {rank}");
    bool one_process = true;
    for (std::size_t r = 0; r < processes.size(); ++r) {
      if (processes[r].boot != processes[0].boot) {
        throw std::invalid_argument("fiar: HostPlatform needs every rank on one machine, but rank " +
                                    std::to_string(r) + " runs under another kernel than rank 0 (another boot id)" +
                                    ". Fix: use CudaPlatform across machines; the host emulator shares host memory.");
      }
      one_process = one_process && processes[r] == processes[0];
    }
    if (!one_process) return register_peers(boot, allocate_across_processes(boot, bytes), bytes);
    std::shared_ptr<std::uint32_t> mine(allocate_words(bytes).release(), FreeDeleter{});
    const auto key = reinterpret_cast<std::uintptr_t>(mine.get());
    {
      std::lock_guard lock(registry_mutex());
      registry()[key] = mine;
    }
    const auto addresses = all_gather_value(boot, key);
    std::vector<std::uint32_t*> peers;
    {
      std::lock_guard lock(registry_mutex());
      for (auto a : addresses) {
        shared_.push_back(registry().at(a));
        peers.push_back(reinterpret_cast<std::uint32_t*>(a));
      }
    }
    boot.barrier();  // every rank holds every block now: drop the hand-over entry
    {
      std::lock_guard lock(registry_mutex());
      registry().erase(key);
    }
    return register_peers(boot, std::move(peers), bytes);
  }

  /// Whether the last allocate_shared mapped POSIX shared memory (its ranks run in more than one process).
  [[nodiscard]] bool across_processes() const noexcept { return across_processes_; }

  /// Collective: allocate_shared, plus the group's emulated multicast object over those blocks: a store
  /// through the returned view lands in every rank's block (HostCtx::multicast_store16 plays the switch).
  /// Throws fiar::multicast_error on every rank alike when any rank's options say the machine has no
  /// multicast.
  template <Bootstrap B>
  MulticastRegion allocate_multicast(B& boot, std::size_t bytes) {
    const auto support = detail::agree(boot, init_, static_cast<std::uint8_t>(options_.multicast ? 1 : 0),
                                       "HostPlatform setup failed on rank {rank}");
    for (std::size_t r = 0; r < support.size(); ++r) {
      if (support[r] == 0) {
        throw multicast_error("fiar: NVLink multicast setup failed: rank " + std::to_string(r) +
                                  " runs on an (emulated) machine without multicast (HostPlatformOptions::multicast "
                                  "= false). Fix: use the trtllm backend on one node or nccl across nodes; on "
                                  "one node, Backend::Auto falls back to trtllm by itself.",
                              static_cast<int>(cudaErrorNotSupported));
      }
    }
    MulticastRegion region;
    region.peers = allocate_shared(boot, bytes);
    members_.push_back(std::make_unique<std::vector<std::uint32_t*>>(region.peers));
    region.view.address = nullptr;
    region.view.members = members_.back()->data();
    region.view.member_count = static_cast<int>(members_.back()->size());
    region.view.stores = multicast_stores_.get();
    return region;
  }

  /// Multicast stores this rank's kernels made so far (the emulator counts them, so tests can check that a
  /// protocol delivers through multicast what it should).
  [[nodiscard]] std::uint32_t multicast_stores() const {
    return exec::SystemAtomics::load_acquire(multicast_stores_.get());
  }

  /// Memory only this rank's kernels use (protocol state, sum buffers), zero-filled.
  void* allocate_local(std::size_t bytes, const char* /*what*/ = "protocol state") {
    return allocate_counted(bytes, exec::Space::Device);
  }

  /// Memory the kernels write and the host reads without synchronizing (error records), zero-filled.
  void* allocate_host_visible(std::size_t bytes) { return allocate_counted(bytes, exec::Space::HostVisible); }

  /// Fills this rank's own memory with a 32-bit pattern.
  void fill_words(std::uint32_t* p, std::size_t words, std::uint32_t value) {
    for (std::size_t i = 0; i < words; ++i) exec::SystemAtomics::store_relaxed(p + i, value);
  }

  /// Reads a word the kernels write (host-visible memory).
  static std::uint32_t read_word(const std::uint32_t* p) { return exec::SystemAtomics::load_acquire(p); }

  /// Checks a caller's data pointer: host memory is all this platform can use, so nothing to check.
  void check_pointer(const void*, const char*) const {}

  /// Runs operation Op on the emulated grid (every lane of every block) and returns when all lanes have returned:
  /// a launch plus a stream synchronisation. The grid is the platform's (Options), whatever Op's CUDA shape is.
  /// Options::asynchronous: the launch (its parameters copied) is queued on `stream` and this returns at once; while
  /// the stream is being captured (begin_capture) it is recorded instead.
  template <exec::Operation Op>
  void launch(const typename Op::Params& p, cudaStream_t stream = nullptr) {
    if (!grid_) throw std::logic_error(detail::moved_from_text("HostPlatform"));
    if (!options_.asynchronous) return run_on<Op>(grid_.get(), options_, p);
    // The task holds what it needs by value (the grid lives on the heap): a platform moved meanwhile stays valid.
    std::function<void()> task = [grid = grid_.get(), options = options_, p] { run_on<Op>(grid, options, p); };
    if (capturing_ && stream == capture_stream_) return capture_.tasks.push_back(std::move(task));
    stream_of(stream)->submit(std::move(task));
  }

  /// The architecture this platform runs kernels for: 0, the host emulator follows the topology's.
  static constexpr int arch() { return 0; }

  /// Waits for every launch queued on this platform's own stream and on the streams it launched on
  /// (cudaDeviceSynchronize for this rank); nothing to wait for when launches are synchronous. Not allowed while
  /// capturing.
  void synchronize() {
    refuse_while_capturing("synchronize");
    drain();
    for_each_stream(rethrow);
  }

  /// Options::asynchronous: waits for what is queued on `stream` so far (cudaStreamSynchronize).
  void synchronize(cudaStream_t stream) {
    refuse_while_capturing("synchronize");
    if (!options_.asynchronous) return;
    auto s = stream_of(stream);
    s->synchronize();
    rethrow(s);
  }
  /// Whether launches queue (Options::asynchronous).
  [[nodiscard]] bool asynchronous() const { return options_.asynchronous; }

  /// A new emulated stream (cudaStreamCreate), shared by every platform of the process that launches on it; release it
  /// with destroy_stream.
  static cudaStream_t create_stream() { return HostStreams::create(); }
  static void destroy_stream(cudaStream_t stream) { HostStreams::destroy(stream); }
  /// cudaEventRecord: a point in `stream` after everything queued on it so far.
  HostEvent record_event(cudaStream_t stream = nullptr) {
    if (!options_.asynchronous) return HostEvent{};
    auto s = stream_of(stream);
    return HostEvent{s, s->submitted()};
  }
  /// cudaStreamWaitEvent: what is queued on `stream` after this waits for `event`.
  void wait_event(cudaStream_t stream, const HostEvent& event) {
    if (options_.asynchronous) stream_of(stream)->submit([event] { event.synchronize(); });
  }

  /// Stream capture (cudaStreamBeginCapture on one stream): until end_capture, launches on `stream` are recorded, not
  /// run, and synchronize() and allocations throw std::logic_error (what a CUDA capture forbids). Asynchronous only.
  void begin_capture(cudaStream_t stream = nullptr) {
    if (!options_.asynchronous || capturing_) {
      throw std::logic_error(
          "fiar: HostPlatform::begin_capture needs HostPlatformOptions::asynchronous and no capture "
          "under way. Fix: set asynchronous = true and end the running capture first.");
    }
    capturing_ = true;
    capture_stream_ = stream;
    capture_ = {};
  }
  /// Ends the capture: the launches recorded, as a sequence replay() runs.
  HostGraph end_capture() {
    capturing_ = false;
    return std::exchange(capture_, HostGraph{});
  }
  /// cudaGraphLaunch: queues the recorded launches on `stream`, in order, with the parameters they were recorded with.
  void replay(const HostGraph& graph, cudaStream_t stream = nullptr) {
    auto s = stream_of(stream);
    for (const auto& task : graph.tasks) s->submit(task);
  }

  /// Options::count_accesses: the kernels' memory accesses so far, per space (null when not counted).
  [[nodiscard]] const exec::AccessCounter* access_counts() const { return counter_.get(); }

  /// Which stream a call's cudaStream_t names, as a key that two ranks of one process share exactly when they share the
  /// stream: nullptr is each platform's own stream; an emulator stream is itself.
  [[nodiscard]] std::uintptr_t stream_key(cudaStream_t stream) const {
    return stream == nullptr ? reinterpret_cast<std::uintptr_t>(this) | 1u : reinterpret_cast<std::uintptr_t>(stream);
  }

  [[nodiscard]] const exec::HostGrid& grid() const { return *grid_; }

 private:
  template <exec::Operation Op>
  static void run_on(exec::HostGrid* grid, const Options& options, const typename Op::Params& p) {
    // One reference captured: the std::function the grid takes keeps it inline (a warm call allocates nothing).
    const struct {
      const typename Op::Params& params;
      const Options& options;
    } launch{p, options};
    grid->run([&launch](exec::HostCtx& ctx) {
      if (launch.options.lane_start != nullptr)
        launch.options.lane_start(launch.options.lane_start_arg, ctx.block(), ctx.lane());
      Op::run(ctx, launch.params);
    });
  }

  // The stream a launch names (asynchronous mode): nullptr is the platform's own (made at its first use); every stream
  // used is remembered, so that synchronize() and the destructor wait for it.
  std::shared_ptr<HostStream> stream_of(cudaStream_t stream) {
    if (!used_mutex_) throw std::logic_error(detail::moved_from_text("HostPlatform"));
    if (!own_stream_) own_stream_ = std::make_shared<HostStream>();
    if (stream == nullptr) return own_stream_;
    auto s = HostStreams::find(stream);
    std::lock_guard lock(*used_mutex_);
    bool known = false;
    for (auto& u : used_) known = known || u == s;
    if (!known) used_.push_back(s);
    return s;
  }
  // f(stream) for this platform's own stream and every stream it launched on (none once moved from).
  template <class F>
  void for_each_stream(F&& f) {
    if (own_stream_) f(own_stream_);
    if (!used_mutex_) return;  // moved from
    std::lock_guard lock(*used_mutex_);
    for (auto& u : used_) f(u);
  }
  void drain() {
    for_each_stream([](const std::shared_ptr<HostStream>& s) { s->synchronize(); });
  }
  // What a launch queued on `s` threw (a kernel's host-side failure), thrown here, once.
  static void rethrow(const std::shared_ptr<HostStream>& s) {
    if (auto e = s->take_error()) std::rethrow_exception(e);
  }
  void refuse_while_capturing(const char* what) const {
    if (capturing_) {
      throw std::logic_error(std::string("fiar: HostPlatform::") + what +
                             " during a stream capture: a captured call must not synchronize or allocate (a CUDA "
                             "capture fails the same way). Fix: do it before begin_capture or after end_capture.");
    }
  }
  void* allocate_counted(std::size_t bytes, exec::Space space) {
    refuse_while_capturing("allocation");
    locals_.push_back(allocate_words(bytes));
    if (counter_) counter_->add_range(locals_.back().get(), bytes, space);
    return locals_.back().get();
  }
  template <Bootstrap B>
  std::vector<std::uint32_t*> register_peers(B& boot, std::vector<std::uint32_t*> peers, std::size_t bytes) {
    if (counter_) {
      for (std::size_t r = 0; r < peers.size(); ++r) {
        counter_->add_range(peers[r], bytes,
                            static_cast<int>(r) == boot.rank() ? exec::Space::Device : exec::Space::Peer);
      }
    }
    return peers;
  }

  struct FreeDeleter {
    void operator()(std::uint32_t* p) const { std::free(p); }
  };
  using Block = std::unique_ptr<std::uint32_t, FreeDeleter>;

  static Block allocate_words(std::size_t bytes) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    return Block(static_cast<std::uint32_t*>(p));
  }

  // allocate_shared when the ranks are processes: each rank creates a segment, every rank maps every segment, then
  // each rank removes its segment's name (the mappings keep the memory until the last process unmaps it or exits).
  template <Bootstrap B>
  std::vector<std::uint32_t*> allocate_across_processes(B& boot, std::size_t bytes) {
    struct Name {
      std::array<char, 96> text{};
    };
    const std::size_t rounded = (bytes + 63) / 64 * 64 + 64;
    std::string own_name;
    std::shared_ptr<std::uint32_t> own;
    Name mine;
    const auto created = detail::attempt([&] {
      detail::remove_stale_segments();
      own_name = detail::host_segment_name(detail::random_id());
      own = detail::create_segment(own_name, rounded);
      std::memcpy(mine.text.data(), own_name.data(), std::min(own_name.size(), mine.text.size() - 1));
    });
    const auto unlink_own = [&] {
      if (own) (void)::shm_unlink(own_name.c_str());
    };
    std::vector<Name> names;
    try {
      names = detail::agree(boot, created, mine, "HostPlatform shared memory setup failed on rank {rank}");
    } catch (...) {
      unlink_own();
      throw;
    }
    std::vector<std::shared_ptr<std::uint32_t>> maps(names.size());
    const auto mapped = detail::attempt([&] {
      for (std::size_t r = 0; r < names.size(); ++r) {
        if (static_cast<int>(r) == boot.rank()) {
          maps[r] = own;
          continue;
        }
        // A peer's name is opened only when it is one the emulator makes (terminated, fiar's prefix).
        if (!detail::is_host_segment_name(names[r].text.data(), names[r].text.size())) {
          throw std::runtime_error("fiar: rank " + std::to_string(r) +
                                   " sent a shared-memory segment name the host emulator does not make. Fix: run "
                                   "every rank with the same fiar version.");
        }
        maps[r] = detail::open_segment(names[r].text.data(), rounded);
      }
    });
    try {
      // Once this returns, every rank has mapped every segment: the names can go.
      detail::agree(boot, mapped, "HostPlatform shared memory setup failed on rank {rank}");
    } catch (...) {
      unlink_own();
      throw;
    }
    unlink_own();
    across_processes_ = true;
    std::vector<std::uint32_t*> peers;
    for (auto& m : maps) {
      peers.push_back(m.get());
      shared_.push_back(std::move(m));
    }
    return peers;
  }

  // Blocks being handed over between the ranks of a group during allocate_shared.
  static std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<std::uintptr_t, std::shared_ptr<std::uint32_t>>& registry() {
    static std::unordered_map<std::uintptr_t, std::shared_ptr<std::uint32_t>> r;
    return r;
  }

  Options options_;
  std::unique_ptr<exec::AccessCounter> counter_;  // before the grid, whose lanes hold it
  std::unique_ptr<exec::HostGrid> grid_;
  std::shared_ptr<HostStream> own_stream_;  // asynchronous: the stream nullptr names
  std::vector<std::shared_ptr<HostStream>> used_;
  std::unique_ptr<std::mutex> used_mutex_ = std::make_unique<std::mutex>();
  bool capturing_ = false;
  cudaStream_t capture_stream_ = nullptr;
  HostGraph capture_;
  std::vector<std::unique_ptr<std::vector<std::uint32_t*>>> members_;                      // emulated multicast groups
  std::unique_ptr<std::uint32_t> multicast_stores_ = std::make_unique<std::uint32_t>(0u);  // stable across moves
  detail::StepOutcome init_;  ///< the constructor's failure (a bad grid), raised by the first collective
  std::vector<std::shared_ptr<std::uint32_t>> shared_;  // every rank's block, co-owned
  std::vector<Block> locals_;
  bool across_processes_ = false;
};

FIAR_END_NAMESPACE
