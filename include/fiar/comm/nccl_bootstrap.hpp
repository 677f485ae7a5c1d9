// SPDX-License-Identifier: Apache-2.0
// fiar/comm/nccl_bootstrap.hpp — NcclBootstrap: the Bootstrap of an existing NCCL communicator, so that topology
// discovery and workspace creation run over the caller's tensor-parallel group. Only with FIAR_HAS_NCCL.
// Contract: rank/size are the communicator's; all_gather is an ncclAllGather through a small device staging
// buffer, bounded in time (on expiry the communicator is aborted and fiar::timeout_error raised, then and on
// every later collective); barrier is a one-byte all_gather; the destructor never throws.
#pragma once

#include "../runtime/nccl.hpp"

#if FIAR_HAS_NCCL

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "../core/errors.hpp"
#include "../core/text.hpp"
#include "../runtime/cuda.hpp"
#include "bootstrap.hpp"

FIAR_BEGIN_NAMESPACE

/// A Bootstrap over an existing NCCL communicator (not owned: the caller destroys it, after this object).
/// Each rank wraps its own communicator; the collectives run on a private stream of the communicator's GPU
/// and all ranks must call them in the same order, as with any NCCL collective.
///
/// Bounded waits: a collective that has not finished after `timeout` aborts the communicator (ncclCommAbort,
/// which also ends NCCL's kernels that wait for the missing rank) and throws fiar::timeout_error; NCCL cannot
/// tell which rank is missing. After that the communicator is gone (do not use or destroy it) and every later
/// collective of this bootstrap throws the same error at once.
class NcclBootstrap {
 public:
  /// Wraps `comm`, which must have finished initializing (a non-blocking one is waited for, up to timeout).
  explicit NcclBootstrap(NcclComm comm, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : comm_(comm), timeout_(timeout) {
    if (comm == nullptr) {
      throw std::invalid_argument(
          "fiar: NcclBootstrap got a null ncclComm_t. Fix: pass an initialized communicator (ncclCommInitRank, "
          "ncclCommSplit) of the group whose ranks should exchange bytes.");
    }
    if (timeout.count() <= 0) {
      throw std::invalid_argument("fiar: NcclBootstrap timeout = " + std::to_string(timeout.count()) +
                                  " ms; allowed: more than 0 ms. Fix: pass a positive bound (default 60 s).");
    }
    const ncclResult_t ready = detail::nccl_wait(comm_, deadline());
    if (ready == ncclInProgress) {
      throw timeout_error("fiar: NcclBootstrap: the communicator was still initializing after " +
                          std::to_string(timeout_.count()) +
                          " ms (ncclCommGetAsyncError reported ncclInProgress). Check: every rank of the group "
                          "called ncclCommInitRank(Config) with the same unique id and world size.");
    }
    detail::nccl_check(ready, "ncclCommGetAsyncError (NcclBootstrap)",
                       "the communicator is healthy; an earlier NCCL call on it failed", comm_);
    detail::nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount (NcclBootstrap)",
                       "the communicator is valid and initialized", comm_);
    detail::nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank (NcclBootstrap)",
                       "the communicator is valid and initialized", comm_);
    detail::nccl_check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice (NcclBootstrap)",
                       "the communicator is valid and initialized", comm_);
    detail::DeviceGuard guard(device_);
    stream_ = detail::make_stream(device_, "NcclBootstrap");
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The wrapped communicator (null after a timeout aborted it).
  [[nodiscard]] NcclComm comm() const noexcept { return stream_ ? comm_ : nullptr; }
  /// The CUDA device of the communicator (where the staging buffer and the stream live).
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// Collective: out receives every rank's `in` (equal sizes on every rank), in rank order.
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    if (!stream_) throw std::logic_error(detail::moved_from_text("NcclBootstrap"));
    if (!broken_.empty()) throw timeout_error(broken_);
    if (out.size() != in.size() * static_cast<std::size_t>(size_)) {
      throw std::invalid_argument("fiar: all_gather on rank " + std::to_string(rank_) + ": output holds " +
                                  std::to_string(out.size()) + " bytes; it must hold size() x input = " +
                                  std::to_string(size_) + " x " + std::to_string(in.size()) + " bytes.");
    }
    const std::size_t block = in.empty() ? 1 : in.size();  // a barrier moves one byte per rank
    const std::size_t total = block * (static_cast<std::size_t>(size_) + 1);
    detail::DeviceGuard guard(device_);
    reserve(total);
    std::byte* send_host = static_cast<std::byte*>(host_.get());
    std::byte* recv_host = send_host + block;
    std::byte* send_dev = static_cast<std::byte*>(device_buffer_.get());
    std::byte* recv_dev = send_dev + block;
    if (in.empty()) {
      send_host[0] = std::byte{0};
    } else {
      std::memcpy(send_host, in.data(), in.size());
    }
    const std::string what =
        "NcclBootstrap all_gather on rank " + std::to_string(rank_) + " (" + std::to_string(block) + " bytes per rank)";
    detail::cuda_check(cudaMemcpyAsync(send_dev, send_host, block, cudaMemcpyHostToDevice, stream_.get()),
                       "cudaMemcpyAsync (" + what + ")", "the device is healthy");
    const ncclResult_t r = ncclAllGather(send_dev, recv_dev, block, ncclUint8, comm_, stream_.get());
    detail::nccl_check(r, "ncclAllGather (" + what + ")",
                       "every rank calls the same collectives in the same order with the same sizes", comm_);
    const auto end = deadline();
    if (r == ncclInProgress) {  // a non-blocking communicator still enqueues the collective
      const ncclResult_t enqueued = detail::nccl_wait(comm_, end);
      if (enqueued == ncclInProgress) expire(what);
      detail::nccl_check(enqueued, "ncclAllGather (" + what + ", reported by ncclCommGetAsyncError)",
                         "the network and every peer rank are healthy", comm_);
    }
    detail::cuda_check(cudaMemcpyAsync(recv_host, recv_dev, block * static_cast<std::size_t>(size_),
                                       cudaMemcpyDeviceToHost, stream_.get()),
                       "cudaMemcpyAsync (" + what + ")", "the device is healthy");
    wait_for_stream(what, end);
    if (!in.empty()) std::memcpy(out.data(), recv_host, out.size());
  }

  /// Collective: returns when every rank has called it.
  void barrier() { all_gather({}, {}); }

 private:
  std::chrono::steady_clock::time_point deadline() const { return std::chrono::steady_clock::now() + timeout_; }

  // Polls the private stream until the collective and its copies are done, the communicator reports an
  // error (fiar::cuda_error), or the deadline passes (abort, fiar::timeout_error).
  void wait_for_stream(const std::string& what, std::chrono::steady_clock::time_point end) {
    for (int spin = 0;; ++spin) {
      const cudaError_t e = cudaStreamQuery(stream_.get());
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        detail::cuda_check(e, "cudaStreamQuery (" + what + ")",
                           "the device is healthy; an earlier kernel may have faulted");
      }
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
        throw cuda_error(detail::nccl_failure_text("ncclAllGather (" + what + ", reported by ncclCommGetAsyncError)",
                                                   state, "the network and every peer rank are healthy", comm_),
                         static_cast<int>(state));
      }
      if (std::chrono::steady_clock::now() > end) expire(what);
      if (spin < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  [[noreturn]] void expire(const std::string& what) {
    broken_ = "fiar: " + what + " did not finish within " + std::to_string(timeout_.count()) +
              " ms: a rank crashed, hung, or called a different collective (NCCL cannot tell which rank). The "
              "communicator was aborted (ncclCommAbort): do not use or destroy it; recreate the group.";
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    throw timeout_error(broken_);
  }

  // Grows the pinned host and device staging buffers to `bytes` each.
  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    device_buffer_.reset();
    host_.reset();
    capacity_ = 0;
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    device_buffer_ = detail::device_malloc(device_, rounded, "NcclBootstrap staging", "free GPU memory (nvidia-smi)");
    void* h = nullptr;
    detail::cuda_check(cudaMallocHost(&h, rounded),
                       "cudaMallocHost(" + std::to_string(rounded) + " bytes, NcclBootstrap staging)",
                       "pinned host memory is available (ulimit -l)");
    host_ = detail::PinnedHostMemory(h, {device_});
    capacity_ = rounded;
  }

  NcclComm comm_ = nullptr;
  std::chrono::milliseconds timeout_{0};
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  detail::StreamHandle stream_;         ///< the collectives' stream (null once moved from)
  detail::DeviceMemory device_buffer_;  ///< [send block][size x receive blocks]
  detail::PinnedHostMemory host_;       ///< pinned mirror of device_buffer_
  std::size_t capacity_ = 0;
  std::string broken_;
};

static_assert(Bootstrap<NcclBootstrap>);

FIAR_END_NAMESPACE

#endif  // FIAR_HAS_NCCL
