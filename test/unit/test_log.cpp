// SPDX-License-Identifier: Apache-2.0
// The log levels: their names and order, FIAR_LOG_LEVEL's parsing, and what the default sink prints on stderr.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using fiar::LogLevel;

// Sets FIAR_LOG_LEVEL (nullptr: unsets it) for one test, so that the next message reads it again; restores the
// previous value when it ends.
struct LogLevelEnv {
  std::optional<std::string> previous;
  explicit LogLevelEnv(const char* value) {
    if (const char* v = std::getenv(fiar::log_level_env_var)) previous = v;
    set(value);
  }
  ~LogLevelEnv() { set(previous ? previous->c_str() : nullptr); }
  static void set(const char* value) {
    if (value != nullptr) {
      ::setenv(fiar::log_level_env_var, value, 1);
    } else {
      ::unsetenv(fiar::log_level_env_var);
    }
    fiar::detail::forget_log_level();
  }
};

// What the process writes to stderr while f runs (stderr goes to a pipe meanwhile).
template <class F>
std::string captured_stderr(F f) {
  std::fflush(stderr);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[1]);
  f();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  return out;
}

// One message at each level, through the default sink; returns what it printed.
std::string log_each_level() {
  const auto previous = fiar::set_log_sink(nullptr);
  std::string out = captured_stderr([] {
    fiar::log(LogLevel::Debug, "d-message");
    fiar::log(LogLevel::Info, "i-message");
    fiar::log(LogLevel::Warning, "w-message");
    fiar::log(LogLevel::Error, "e-message");
  });
  fiar::set_log_sink(previous);
  return out;
}

int count(const std::string& text, std::string_view what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("log levels: names, numbers kept, importance order", "[log]") {
  STATIC_REQUIRE(static_cast<int>(LogLevel::Info) == 0);
  STATIC_REQUIRE(static_cast<int>(LogLevel::Warning) == 1);
  STATIC_REQUIRE(to_string(LogLevel::Info) == "info");
  STATIC_REQUIRE(to_string(LogLevel::Warning) == "warning");
  STATIC_REQUIRE(to_string(LogLevel::Error) == "error");
  STATIC_REQUIRE(to_string(LogLevel::Debug) == "debug");
  STATIC_REQUIRE(fiar::severity(LogLevel::Debug) < fiar::severity(LogLevel::Info));
  STATIC_REQUIRE(fiar::severity(LogLevel::Info) < fiar::severity(LogLevel::Warning));
  STATIC_REQUIRE(fiar::severity(LogLevel::Warning) < fiar::severity(LogLevel::Error));
}

TEST_CASE("log levels: parse_log_level takes the four names in any case, nothing else", "[log]") {
  STATIC_REQUIRE(fiar::parse_log_level("debug") == LogLevel::Debug);
  CHECK(fiar::parse_log_level("error") == LogLevel::Error);
  CHECK(fiar::parse_log_level("WARNING") == LogLevel::Warning);
  CHECK(fiar::parse_log_level("Info") == LogLevel::Info);
  CHECK(fiar::parse_log_level("dEbUg") == LogLevel::Debug);
  for (const char* bad : {"", "warn", "infos", " info", "verbose", "2", "err"}) {
    INFO(bad);
    CHECK_FALSE(fiar::parse_log_level(bad).has_value());
  }
}

TEST_CASE("log levels: FIAR_LOG_LEVEL selects what the default sink prints", "[log]") {
  struct Case {
    const char* env;
    LogLevel threshold;
    std::vector<std::string_view> printed, silent;
  };
  const std::vector<Case> cases = {
      {nullptr, LogLevel::Warning, {"w-message", "e-message"}, {"d-message", "i-message"}},
      {"", LogLevel::Warning, {"w-message", "e-message"}, {"d-message", "i-message"}},
      {"error", LogLevel::Error, {"e-message"}, {"d-message", "i-message", "w-message"}},
      {"warning", LogLevel::Warning, {"w-message", "e-message"}, {"d-message", "i-message"}},
      {"INFO", LogLevel::Info, {"i-message", "w-message", "e-message"}, {"d-message"}},
      {"debug", LogLevel::Debug, {"d-message", "i-message", "w-message", "e-message"}, {}},
  };
  for (const Case& c : cases) {
    INFO("FIAR_LOG_LEVEL=" << (c.env ? c.env : "(unset)"));
    LogLevelEnv env(c.env);
    CHECK(fiar::log_level() == c.threshold);
    for (const LogLevel level : {LogLevel::Debug, LogLevel::Info, LogLevel::Warning, LogLevel::Error}) {
      CHECK(fiar::log_enabled(level) == (fiar::severity(level) >= fiar::severity(c.threshold)));
    }
    const std::string out = log_each_level();
    for (auto m : c.printed) CHECK(count(out, m) == 1);
    for (auto m : c.silent) CHECK(count(out, m) == 0);
    // One line per message, with its level.
    CHECK(count(out, "\n") == static_cast<int>(c.printed.size()));
    if (count(out, "w-message") == 1) CHECK(count(out, "fiar [warning] w-message\n") == 1);
    if (count(out, "d-message") == 1) CHECK(count(out, "fiar [debug] d-message\n") == 1);
  }
}

TEST_CASE("log levels: an invalid FIAR_LOG_LEVEL is reported once, then counts as warning", "[log]") {
  LogLevelEnv env("loud");
  const std::string first = log_each_level();
  INFO(first);
  CHECK(count(first, "FIAR_LOG_LEVEL='loud' is not a log level; allowed: error, warning, info, debug") == 1);
  CHECK(count(first, "fiar [warning] FIAR_LOG_LEVEL=") == 1);
  CHECK(count(first, "w-message") == 1);
  CHECK(count(first, "e-message") == 1);
  CHECK(count(first, "i-message") == 0);
  CHECK(fiar::log_level() == LogLevel::Warning);
  const std::string again = log_each_level();
  CHECK(count(again, "FIAR_LOG_LEVEL=") == 0);
  CHECK(count(again, "w-message") == 1);
}

TEST_CASE("log levels: a sink of one's own receives every message, whatever FIAR_LOG_LEVEL says", "[log]") {
  LogLevelEnv env("error");
  std::vector<std::pair<LogLevel, std::string>> got;
  const auto previous = fiar::set_log_sink([&](LogLevel level, std::string_view m) { got.emplace_back(level, m); });
  CHECK(fiar::log_enabled(LogLevel::Debug));
  const std::string printed = captured_stderr([] {
    fiar::log(LogLevel::Debug, "d");
    fiar::log(LogLevel::Info, "i");
    fiar::log(LogLevel::Warning, "w");
    fiar::log(LogLevel::Error, "e");
  });
  fiar::set_log_sink(previous);
  CHECK(printed.empty());
  REQUIRE(got.size() == 4);
  CHECK(got[0] == std::pair<LogLevel, std::string>{LogLevel::Debug, "d"});
  CHECK(got[3] == std::pair<LogLevel, std::string>{LogLevel::Error, "e"});
  // The default sink again: the threshold applies.
  fiar::set_log_sink(nullptr);
  CHECK_FALSE(fiar::log_enabled(LogLevel::Warning));
  CHECK(fiar::log_enabled(LogLevel::Error));
  fiar::set_log_sink(previous);
}
