// SPDX-License-Identifier: Apache-2.0
// Command-line handling shared by fiar-check, fiar-demo and fiar-bench (tools/, not part of the library).
// CLI11 reads the command line (--flag value and --flag=value, -h/--help, --version, unknown options, missing
// values); each tool's converters check the values with the messages the tools always had. Every usage error is
// one line on stderr and exit status kExitUsage, the same in the three tools.
#pragma once

#include <fiar/fiar.hpp>

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fiar_cli {

/// The tools' exit statuses: success, a failure (a mismatch, a failed run or discovery), and a configuration fiar
/// rejects or a bad command line (--help and --version exit 0).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitRejected = 2;
inline constexpr int kExitUsage = kExitRejected;

/// A bad command line (a value out of range, options that contradict each other).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A command-line value as the tools quote it in messages: 'value'.
inline std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

/// "cudaErrorNoDevice: no CUDA-capable device is detected".
inline std::string describe_cuda(cudaError_t e) { return fiar::detail::describe_cuda(e); }

/// The integer `text` given to `flag`, at least `min`.
inline int parse_int(std::string_view flag, std::string_view text, int min) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min) {
    throw UsageError(std::string(flag) + " " + fiar_cli::quoted(text) +
                     ": expected an integer >= " + std::to_string(min));
  }
  return v;
}

/// Prints one line on stderr: `message` as it is when it already says where it comes from (fiar's own errors start
/// with "fiar: ", a tool's with "<tool>: "), else "<tool>: <message>".
inline void print_error(std::string_view tool, std::string_view message) {
  const bool named =
      message.rfind("fiar: ", 0) == 0 ||
      (message.size() > tool.size() && message.substr(0, tool.size()) == tool && message[tool.size()] == ':');
  if (named) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
  } else {
    std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(tool.size()), tool.data(), static_cast<int>(message.size()),
                 message.data());
  }
}

/// The exit status of a run that ended with `e`, printed as print_error does: kExitRejected for a configuration fiar
/// rejects (std::invalid_argument), kExitFailed for any other failure.
inline int exit_status_of(std::string_view tool, const std::exception& e) {
  print_error(tool, e.what());
  return dynamic_cast<const std::invalid_argument*>(&e) != nullptr ? kExitRejected : kExitFailed;
}

/// One tool's command line. Every option takes one value, as `--flag value` or `--flag=value` (given twice, the
/// last one counts); its converter receives the flag's name and the text, stores the value and throws UsageError
/// (or fiar's std::invalid_argument) when the text is not allowed. The converters run once CLI11 has read the whole
/// line, in command-line order, so a misspelt flag anywhere is reported before any value is checked.
class CommandLine {
 public:
  using Convert = std::function<void(const std::string& flag, const std::string& value)>;

  /// `usage`: the text --help prints on stdout.
  CommandLine(std::string tool, std::string usage) : tool_(std::move(tool)), usage_(std::move(usage)), app_("", tool_) {
    app_.set_help_flag("-h,--help");
    app_.set_version_flag("--version", tool_ + " " + fiar::version_string);
    app_.allow_extras();  // unknown arguments are collected and reported by parse(), in the tools' words
    names_ = {"-h", "--help", "--version"};
  }

  /// An option with a value: `name` is "--nodes" or "-b" (one name per option).
  CommandLine& option(const std::string& name, Convert convert) {
    CLI::Option* opt = app_.add_option(name)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    options_.push_back({opt, name, std::move(convert)});
    names_.insert(name);
    return *this;
  }

  /// An option without a value, which sets `target`.
  CommandLine& flag(const std::string& name, bool& target) {
    app_.add_flag(name, target)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    names_.insert(name);
    return *this;
  }

  /// Reads argv: std::nullopt when the tool goes on, else the status main returns: 0 after --help (the usage on
  /// stdout) or --version, kExitUsage after a usage error (one line on stderr). `check` runs after the converters,
  /// for rules across options, and may throw the same errors.
  std::optional<int> parse(int argc, char** argv, const std::function<void()>& check = {}) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::fputs(usage_.c_str(), stdout);
      return 0;
    } catch (const CLI::CallForVersion& e) {
      std::printf("%s\n", e.what());
      return 0;
    } catch (const CLI::ArgumentMismatch& e) {
      // CLI11: "<name>: 1 required <type> missing", when the command line ends after a flag that takes a value.
      const std::string text = e.what();
      const std::string name = text.substr(0, text.find(':'));
      return structural_error(is_option(name) ? name + " needs a value" : text);
    } catch (const CLI::ParseError& e) {
      return structural_error(e.what());
    }
    // A flag followed by another flag instead of its value (CLI11 took the second one as the value; no value of
    // these tools starts with "--").
    for (const auto& o : options_) {
      for (const std::string& value : o.option->results()) {
        if (value.size() <= 2 || value.rfind("--", 0) != 0) continue;
        const std::string name = value.substr(0, value.find('='));
        return structural_error(is_option(name) ? o.name + " needs a value"
                                                : "unknown option " + fiar_cli::quoted(name));
      }
    }
    std::vector<std::string> extra = app_.remaining();
    std::erase(extra, std::string("--"));  // the end-of-options mark is no argument of its own
    if (!extra.empty()) {
      const std::string& first = extra.front();
      const bool looks_like_flag = first.size() > 1 && first[0] == '-';
      return structural_error(looks_like_flag ? "unknown option " + fiar_cli::quoted(first.substr(0, first.find('=')))
                                              : "unexpected argument " + fiar_cli::quoted(first));
    }
    try {
      std::set<const CLI::Option*> done;
      for (const CLI::Option* given : app_.parse_order()) {
        if (!done.insert(given).second) continue;
        for (const auto& o : options_) {
          if (o.option != given) continue;
          std::string value = given->results().back();
          if (o.name.size() == 2 && value.rfind('=', 0) == 0) value.erase(0, 1);  // -e=4K reads as -e 4K
          o.convert(o.name, value);
        }
      }
      if (check) check();
    } catch (const UsageError& e) {
      return usage_error(e.what());
    } catch (const std::invalid_argument& e) {
      return usage_error(e.what());
    }
    return std::nullopt;
  }

  /// Prints a usage error as one line on stderr and returns kExitUsage.
  int usage_error(std::string_view message) const {
    print_error(tool_, message);
    return kExitUsage;
  }

 private:
  // A malformed command line (not a bad value): the message, and where the usage is.
  int structural_error(const std::string& message) const { return usage_error(message + "; see " + tool_ + " --help"); }
  // Whether `name` is one of this tool's flags.
  [[nodiscard]] bool is_option(const std::string& name) const { return names_.count(name) != 0; }

  struct Entry {
    CLI::Option* option;
    std::string name;
    Convert convert;
  };
  std::string tool_, usage_;
  CLI::App app_;
  std::vector<Entry> options_;
  std::set<std::string> names_;
};

}  // namespace fiar_cli
