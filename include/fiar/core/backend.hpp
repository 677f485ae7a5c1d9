// SPDX-License-Identifier: Apache-2.0
// fiar/core/backend.hpp — the all-reduce backends, their names, and FIAR_ALLREDUCE_BACKEND.
// Contract: to_string/parse_backend are constexpr inverses over the one name table ("auto", "trtllm", "mnnvl",
// "nccl"); any other text, or a Backend value outside the enumeration, throws std::invalid_argument naming the
// value and the accepted names.
#pragma once

#include <array>
#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "prelude.hpp"
#include "text.hpp"

FIAR_BEGIN_NAMESPACE

/// The transport a workspace uses. Auto lets resolve_backend() pick from the topology.
enum class Backend { Auto, Trtllm, Mnnvl, Nccl };

/// The environment variable that selects the backend for make_workspace and the tools.
inline constexpr const char* backend_env_var = "FIAR_ALLREDUCE_BACKEND";

namespace detail {

// The one name table: kBackendNames[static_cast<int>(b)] is b's name.
inline constexpr std::string_view kBackendNames[] = {"auto", "trtllm", "mnnvl", "nccl"};
inline constexpr int kBackendCount = static_cast<int>(std::size(kBackendNames));

constexpr std::size_t joined_names_size() {
  std::size_t n = 0;
  for (std::string_view s : kBackendNames) n += s.size() + 2;
  return n - 2;
}
inline constexpr auto kJoinedBackendNames = [] {
  std::array<char, joined_names_size()> out{};
  std::size_t at = 0;
  for (std::string_view s : kBackendNames) {
    if (at != 0) {
      out[at++] = ',';
      out[at++] = ' ';
    }
    for (char c : s) out[at++] = c;
  }
  return out;
}();

}  // namespace detail

/// The accepted spellings, as they appear in messages: "auto, trtllm, mnnvl, nccl".
inline constexpr std::string_view accepted_backend_names{detail::kJoinedBackendNames.data(),
                                                         detail::kJoinedBackendNames.size()};

/// Whether b is one of the enumerators (a value cast from an integer may not be).
constexpr bool is_valid(Backend b) noexcept {
  return static_cast<int>(b) >= 0 && static_cast<int>(b) < detail::kBackendCount;
}

/// Lower-case name of a backend: "auto", "trtllm", "mnnvl" or "nccl" ("invalid" outside the enumeration).
constexpr std::string_view to_string(Backend b) noexcept {
  return is_valid(b) ? detail::kBackendNames[static_cast<int>(b)] : std::string_view("invalid");
}

namespace detail {

// Not constexpr on purpose: reaching it during constant evaluation is a compile error that names it.
[[noreturn]] inline void unknown_backend_name(std::string_view value) {
  throw std::invalid_argument("fiar: unknown all-reduce backend " + quoted(value) +
                              "; accepted: " + std::string(accepted_backend_names) + " (ASCII case-insensitive)");
}

[[noreturn]] inline void backend_value_out_of_range(Backend b) {
  throw std::invalid_argument("fiar: Backend value " + std::to_string(static_cast<int>(b)) +
                              " is not a backend; allowed: " + std::string(accepted_backend_names) +
                              " (fiar::Backend::Auto, Trtllm, Mnnvl, Nccl). Fix: pass one of the enumerators, "
                              "or parse_backend(text).");
}

constexpr bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr bool iequals(std::string_view a, std::string_view lower) noexcept {
  if (a.size() != lower.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (x != lower[i]) return false;
  }
  return true;
}

}  // namespace detail

/// Throws std::invalid_argument (a compile error in a constant expression) unless b is an enumerator.
constexpr void check_backend(Backend b) {
  if (!is_valid(b)) detail::backend_value_out_of_range(b);
}

/// Parses a backend name: ASCII case-insensitive, surrounding whitespace ignored.
/// Throws std::invalid_argument (a compile error in a constant expression) for anything else.
constexpr Backend parse_backend(std::string_view text) {
  const std::string_view t = detail::trim(text);
  for (int i = 0; i < detail::kBackendCount; ++i) {
    if (detail::iequals(t, detail::kBackendNames[i])) return static_cast<Backend>(i);
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
                                " is not an all-reduce backend; accepted: " + std::string(accepted_backend_names) +
                                " (ASCII case-insensitive). Fix: set it to one of those, or unset it to let fiar "
                                "choose (auto).");
  }
}

FIAR_END_NAMESPACE
