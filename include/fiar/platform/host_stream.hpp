// SPDX-License-Identifier: Apache-2.0
// fiar/platform/host_stream.hpp — the host emulator's streams, events and captured sequences: what gives HostPlatform
// a GPU's asynchrony (HostPlatformOptions::asynchronous).
// Contract: a HostStream runs the tasks submitted to it in submission order on a worker thread of its own, one at a
// time; submit() returns at once with the task's ticket; wait(ticket) returns once that task (and every earlier one)
// has run; a HostEvent is a (stream, ticket) pair: complete once the stream has run every task submitted before it was
// recorded. A HostGraph is a recorded sequence of tasks that can be submitted again and again (a CUDA graph's replay).
// Streams handed out as cudaStream_t (HostStreams::create) live in one process-wide table, so that two ranks of one
// process can be given the same stream, as two rank threads can share one CUDA stream.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// One emulated CUDA stream: its tasks run in order on its own worker thread.
class HostStream {
 public:
  HostStream() : worker_([this] { work(); }) {}
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;
  /// Runs what is queued, then stops (like cudaStreamDestroy, which lets queued work finish).
  ~HostStream() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  /// Queues `task`; returns its ticket (1, 2, ...). A task that throws does not stop the stream: the first exception
  /// is kept for take_error().
  std::uint64_t submit(std::function<void()> task) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    const std::uint64_t ticket = ++submitted_;
    wake_.notify_all();
    return ticket;
  }
  /// The ticket of the last task submitted (0: none).
  [[nodiscard]] std::uint64_t submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  /// Whether the task of `ticket` and every earlier one have run (cudaStreamQuery / cudaEventQuery).
  [[nodiscard]] bool done(std::uint64_t ticket) const {
    std::lock_guard lock(mutex_);
    return completed_ >= ticket;
  }
  /// Waits until the task of `ticket` and every earlier one have run (cudaEventSynchronize).
  void wait(std::uint64_t ticket) const {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return completed_ >= ticket; });
  }
  /// Waits for every task submitted so far (cudaStreamSynchronize).
  void synchronize() const { wait(submitted()); }
  /// The first exception a task threw since the last call, or null.
  std::exception_ptr take_error() {
    std::lock_guard lock(mutex_);
    return std::exchange(error_, nullptr);
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr thrown;
      try {
        task();
      } catch (...) {
        thrown = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        if (thrown && !error_) error_ = thrown;
        ++completed_;
      }
      finished_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;  // last: starts once everything above exists
};

/// A point in a stream (cudaEvent_t): complete once every task submitted before it was recorded has run.
struct HostEvent {
  std::shared_ptr<HostStream> stream;
  std::uint64_t ticket = 0;
  /// cudaEventQuery: true when complete (an event never recorded is complete, as in CUDA).
  [[nodiscard]] bool query() const { return !stream || stream->done(ticket); }
  /// cudaEventSynchronize.
  void synchronize() const {
    if (stream) stream->wait(ticket);
  }
};

/// A recorded sequence of launches (what stream capture records into a CUDA graph): replay() submits them again, in
/// order, with the parameters they were recorded with.
struct HostGraph {
  std::vector<std::function<void()>> tasks;
};

/// The process-wide table of the emulator's explicit streams: a cudaStream_t the emulator hands out names one
/// HostStream, whichever rank (platform) launches on it.
class HostStreams {
 public:
  /// A new stream (cudaStreamCreate); destroy() it when done.
  static cudaStream_t create() {
    auto stream = std::make_shared<HostStream>();
    auto handle = reinterpret_cast<cudaStream_t>(stream.get());
    std::lock_guard lock(mutex());
    table()[handle] = std::move(stream);
    return handle;
  }
  /// cudaStreamDestroy: the handle is no longer valid; queued work still runs.
  static void destroy(cudaStream_t handle) {
    std::shared_ptr<HostStream> gone;
    std::lock_guard lock(mutex());
    auto it = table().find(handle);
    if (it != table().end()) {
      gone = std::move(it->second);
      table().erase(it);
    }
  }
  /// The stream behind a handle create() returned; throws std::invalid_argument naming it otherwise.
  static std::shared_ptr<HostStream> find(cudaStream_t handle) {
    std::lock_guard lock(mutex());
    auto it = table().find(handle);
    if (it == table().end()) {
      throw std::invalid_argument(
          "fiar: stream " + std::to_string(reinterpret_cast<std::uintptr_t>(handle)) +
          " is not a stream of the host emulator; allowed: nullptr (the platform's own stream) or a stream from "
          "HostPlatform::create_stream() not yet destroyed. Fix: create the stream with HostPlatform::create_stream.");
    }
    return it->second;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<cudaStream_t, std::shared_ptr<HostStream>>& table() {
    static std::map<cudaStream_t, std::shared_ptr<HostStream>> t;
    return t;
  }
};

FIAR_END_NAMESPACE
