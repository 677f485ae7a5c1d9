// fiar/backend.hpp — the all-reduce backends, their names, and FIAR_ALLREDUCE_BACKEND.
// Contract: to_string/parse_backend are constexpr inverses over "auto", "trtllm", "mnnvl", "nccl";
// any other text throws std::invalid_argument naming the value and the accepted names.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "version.hpp"

namespace fiar::inline v0_1 {

/// The transport a workspace uses. Auto lets resolve_backend() pick from the topology.
enum class Backend { Auto, Trtllm, Mnnvl, Nccl };

/// The environment variable that selects the backend for make_workspace and the tools.
inline constexpr const char* backend_env_var = "FIAR_ALLREDUCE_BACKEND";

/// The accepted spellings, as they appear in messages.
inline constexpr std::string_view accepted_backend_names = "auto, trtllm, mnnvl, nccl";

/// Lower-case name of a backend: "auto", "trtllm", "mnnvl" or "nccl".
constexpr std::string_view to_string(Backend b) noexcept {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Trtllm: return "trtllm";
    case Backend::Mnnvl: return "mnnvl";
    case Backend::Nccl: return "nccl";
  }
  return "invalid";
}

namespace detail {

/// Quotes a user-supplied value for an error message, escaping control characters.
inline std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Not constexpr on purpose: reaching it during constant evaluation is a compile error that names it.
[[noreturn]] inline void unknown_backend_name(std::string_view value) {
  throw std::invalid_argument("fiar: unknown all-reduce backend " + quoted(value) + "; accepted: " +
                              std::string(accepted_backend_names) + " (ASCII case-insensitive)");
}

constexpr bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (x != b[i]) return false;  // b is always a lower-case backend name
  }
  return true;
}

}  // namespace detail

/// Parses a backend name: ASCII case-insensitive, surrounding whitespace ignored.
/// Throws std::invalid_argument (a compile error in a constant expression) for anything else.
constexpr Backend parse_backend(std::string_view text) {
  const std::string_view t = detail::trim(text);
  for (Backend b : {Backend::Auto, Backend::Trtllm, Backend::Mnnvl, Backend::Nccl}) {
    if (detail::iequals(t, to_string(b))) return b;
  }
  detail::unknown_backend_name(text);
}

/// Reads FIAR_ALLREDUCE_BACKEND. Unset, empty or all-whitespace gives Backend::Auto; a bad value throws
/// std::invalid_argument naming the variable, the value and the accepted names.
inline Backend backend_from_env() {
  const char* raw = std::getenv(backend_env_var);
  if (raw == nullptr || detail::trim(raw).empty()) return Backend::Auto;
  try {
    return parse_backend(raw);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(std::string("fiar: ") + backend_env_var + "=" + detail::quoted(raw) +
                                " is not an all-reduce backend; accepted: " +
                                std::string(accepted_backend_names) +
                                " (ASCII case-insensitive). Fix: set it to one of those, or unset it "
                                "to let fiar choose (auto).");
  }
}

}  // namespace fiar::inline v0_1
