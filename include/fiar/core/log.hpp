// SPDX-License-Identifier: Apache-2.0
// fiar/core/log.hpp — where fiar's messages that are not errors go (make_workspace's fallback warning; at info, its
// backend choice; at debug, why a multicast setup failed).
// Contract: the sink is process-wide and replaceable at any time; it is called under a lock, so it never
// runs twice at once; the default writes one line to stderr for each message at or above FIAR_LOG_LEVEL (error,
// warning, info or debug; default warning), while a sink set with set_log_sink receives every message; fiar never
// logs from a kernel or per call.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// How important a message is. The enumerators keep the numbers they were given (Error and Debug came later), so
/// compare importance with severity(), not with the numbers.
enum class LogLevel { Info, Warning, Error, Debug };

/// "info", "warning", "error" or "debug".
constexpr std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::Warning: return "warning";
    case LogLevel::Error: return "error";
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: break;
  }
  return "info";
}

/// The level's rank from least to most important: debug 0, info 1, warning 2, error 3.
constexpr int severity(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::Debug: return 0;
    case LogLevel::Info: return 1;
    case LogLevel::Warning: return 2;
    case LogLevel::Error: return 3;
  }
  return 2;
}

/// The environment variable that sets the default sink's threshold: error, warning, info or debug.
inline constexpr const char* log_level_env_var = "FIAR_LOG_LEVEL";

/// The level named `name`, in any case ("info", "DEBUG"), or std::nullopt for anything else (the empty text too).
constexpr std::optional<LogLevel> parse_log_level(std::string_view name) noexcept {
  constexpr LogLevel levels[] = {LogLevel::Error, LogLevel::Warning, LogLevel::Info, LogLevel::Debug};
  for (const LogLevel level : levels) {
    const std::string_view want = to_string(level);
    if (name.size() != want.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      const char c = name[i] >= 'A' && name[i] <= 'Z' ? static_cast<char>(name[i] - 'A' + 'a') : name[i];
      same = c == want[i];
    }
    if (same) return level;
  }
  return std::nullopt;
}

/// Receives each message: its level and one line of text (no trailing newline).
using LogSink = std::function<void(LogLevel, std::string_view)>;

namespace detail {
struct LogState {
  std::mutex mutex;
  LogSink sink;
  bool threshold_read = false;  // FIAR_LOG_LEVEL is read once, when the default sink first needs it
  LogLevel threshold = LogLevel::Warning;
};
inline LogState& log_state() {
  static LogState state;
  return state;
}
// Writes one message to stderr, whatever its level.
inline void default_log_sink(LogLevel level, std::string_view message) {
  std::fprintf(stderr, "fiar [%.*s] %.*s\n", static_cast<int>(to_string(level).size()), to_string(level).data(),
               static_cast<int>(message.size()), message.data());
}
// The default sink's threshold (the caller holds state.mutex). The first call reads FIAR_LOG_LEVEL; an invalid
// value is reported then, once, and counts as warning.
inline LogLevel default_log_threshold(LogState& state) {
  if (!state.threshold_read) {
    state.threshold_read = true;
    state.threshold = LogLevel::Warning;
    const char* value = std::getenv(log_level_env_var);
    if (value != nullptr && *value != '\0') {
      if (const auto level = parse_log_level(value)) {
        state.threshold = *level;
      } else {
        try {
          default_log_sink(LogLevel::Warning, std::string(log_level_env_var) + "='" + value +
                                                  "' is not a log level; allowed: error, warning, info, debug (in "
                                                  "any case). Using warning.");
        } catch (...) {
        }
      }
    }
  }
  return state.threshold;
}
// Makes the next message read FIAR_LOG_LEVEL again (for tests that change the variable).
inline void forget_log_level() {
  auto& state = log_state();
  std::lock_guard lock(state.mutex);
  state.threshold_read = false;
}
}  // namespace detail

/// Replaces the sink (nullptr restores the default, stderr) and returns the previous one (nullptr when it was
/// the default), so a caller can restore it. A sink of your own receives every message, whatever FIAR_LOG_LEVEL
/// says; filter on the level in it if you need to.
inline LogSink set_log_sink(LogSink sink) {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  return std::exchange(state.sink, std::move(sink));
}

/// The least important level the default sink prints: FIAR_LOG_LEVEL (error, warning, info or debug, in any case),
/// or warning when it is unset, empty or invalid (an invalid value is reported once, on stderr). The variable is
/// read once per process, the first time the default sink needs it.
inline LogLevel log_level() {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  return detail::default_log_threshold(state);
}

/// Whether a message at `level` reaches a sink now: always with a sink set by set_log_sink, else when it is at least
/// as important as log_level(). Lets a caller skip building a message that nobody would see.
inline bool log_enabled(LogLevel level) {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  return state.sink || severity(level) >= severity(detail::default_log_threshold(state));
}

/// Sends one message to the sink (the default prints it when log_enabled(level)). An exception from a user's sink
/// is swallowed: logging never fails a call.
inline void log(LogLevel level, std::string_view message) {
  auto& state = detail::log_state();
  std::lock_guard lock(state.mutex);
  try {
    if (state.sink) {
      state.sink(level, message);
    } else if (severity(level) >= severity(detail::default_log_threshold(state))) {
      detail::default_log_sink(level, message);
    }
  } catch (...) {
  }
}

FIAR_END_NAMESPACE
