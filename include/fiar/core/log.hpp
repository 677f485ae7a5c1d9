// SPDX-License-Identifier: Apache-2.0
// fiar/core/log.hpp — where fiar's messages that are not errors go (one warning when make_workspace falls back from
// an automatic mnnvl choice to trtllm).
// Contract: the sink is process-wide and replaceable at any time; it is called under a lock, so it never
// runs twice at once; the default writes one line to stderr; fiar never logs from a kernel or per call.
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

enum class LogLevel { Info, Warning };

constexpr std::string_view to_string(LogLevel level) noexcept {
  return level == LogLevel::Warning ? "warning" : "info";
}

/// Receives each message: its level and one line of text (no trailing newline).
using LogSink = std::function<void(LogLevel, std::string_view)>;

namespace detail {
struct LogState {
  std::mutex mutex;
  LogSink sink;
};
inline LogState& log_state() {
  static LogState state;
  return state;
}
inline void default_log_sink(LogLevel level, std::string_view message) {
  std::fprintf(stderr, "fiar [%.*s] %.*s\n", static_cast<int>(to_string(level).size()), to_string(level).data(),
               static_cast<int>(message.size()), message.data());
}
}  // namespace detail

/// Replaces the sink (nullptr restores the default, stderr) and returns the previous one (nullptr when it was
/// the default), so a caller can restore it.
inline LogSink set_log_sink(LogSink sink) {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  return std::exchange(state.sink, std::move(sink));
}

/// Sends one message to the sink. An exception from a user's sink is swallowed: logging never fails a call.
inline void log(LogLevel level, std::string_view message) {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  try {
    if (state.sink) {
      state.sink(level, message);
    } else {
      detail::default_log_sink(level, message);
    }
  } catch (...) {
  }
}

FIAR_END_NAMESPACE
