// SPDX-License-Identifier: Apache-2.0
// fiar/core/text.hpp — how fiar writes values into its messages, once for every layer.
// Contract: pure functions; a float is written so that a bad value stays visible (shortest round-trip text),
// user text is quoted with control characters escaped, addresses as %p; the hash is FNV-1a (64 bits).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// Quotes a user-supplied value for an error message, escaping control characters.
inline std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
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

/// The shortest text that reads back as exactly `x` ("-1e-07", "0.5", "inf", "nan").
inline std::string float_text(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

/// An address as text, for messages.
inline std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

/// A 32-bit word as text, "0x" and 8 hex digits.
inline std::string hex_text(std::uint32_t w) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", static_cast<unsigned>(w));
  return buf;
}

/// FNV-1a, 64 bits: node identities, purposes and boot ids become fixed-size keys.
constexpr std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

/// `message` without its leading "fiar: ", to quote it inside another fiar message.
inline std::string without_fiar_prefix(std::string message) {
  if (message.rfind("fiar: ", 0) == 0) message.erase(0, 6);
  return message;
}

/// "0, 3, 5".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

/// The ranks whose bits are set in a 64-bit mask, as rank_list() writes them.
inline std::string rank_mask_text(std::uint64_t mask) {
  std::vector<int> ranks;
  for (int r = 0; r < 64; ++r) {
    if (mask & (std::uint64_t{1} << r)) ranks.push_back(r);
  }
  return rank_list(ranks);
}

/// The message of a call on an object whose state was moved to another one.
inline std::string moved_from_text(std::string_view what) {
  return "fiar: this " + std::string(what) + " was moved from. Fix: call the " + std::string(what) +
         " it was moved to.";
}

}  // namespace detail
FIAR_END_NAMESPACE
