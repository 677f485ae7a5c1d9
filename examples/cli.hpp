// SPDX-License-Identifier: Apache-2.0
// Command-line helpers shared by fiar-check and fiar-demo (example code, not part of the library).
#pragma once

#include <fiar/fiar.hpp>

#include <charconv>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace fiar_cli {

/// A bad command line; the tools print it with their usage text.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A command-line value as the tools quote it in messages: 'value'.
inline std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

/// "cudaErrorNoDevice: no CUDA-capable device is detected".
inline std::string describe_cuda(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

/// The integer `text` given to `flag`, at least `min`.
inline int parse_int(std::string_view flag, std::string_view text, int min) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min) {
    throw UsageError(std::string(flag) + " " + quoted(text) + ": expected an integer >= " + std::to_string(min));
  }
  return v;
}

/// The option at argv[i] and its value, from "--flag=value" or "--flag value" (then i moves past the value).
/// "-h" and "--help" come back as {"--help", ""}.
inline std::pair<std::string, std::string> next_option(int argc, char** argv, int& i) {
  std::string arg = argv[i];
  if (arg == "-h" || arg == "--help") return {"--help", ""};
  if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    return {arg.substr(0, eq), arg.substr(eq + 1)};
  }
  if (i + 1 < argc) return {arg, argv[++i]};
  throw UsageError(arg.rfind("--", 0) == 0 ? arg + " needs a value" : "unexpected argument " + quoted(arg));
}

}  // namespace fiar_cli
