// SPDX-License-Identifier: Apache-2.0
// fiar/comm/agree.hpp — the one agreement primitive: every collective decision of fiar (creation digests, the
// backend choice, pool requests, multicast and platform setup steps, discovery) goes through agree().
// Contract: each rank runs its local part of a step under attempt(), then agree() exchanges every rank's outcome
// with its value; either every rank returns every rank's value, or every rank throws the same exception type for
// the lowest failing rank (its own message there; "fiar: <context naming that rank>: <message>" elsewhere). So a
// rank-local mistake never leaves its peers waiting for a timeout.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "../core/text.hpp"
#include "bootstrap.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

/// How one rank's local part of a collective step ended, in the form that travels between ranks.
struct StepOutcome {
  enum Kind : std::int32_t { kNone, kInvalidArgument, kCuda, kMulticast, kTimeout, kLogic, kOther };
  std::int32_t kind = kNone;
  std::int32_t status = 0;        ///< cuda_error::status() of a kCuda / kMulticast failure
  std::array<char, 2040> text{};  ///< the message (longer ones are cut)

  [[nodiscard]] bool failed() const noexcept { return kind != kNone; }
  [[nodiscard]] std::string message() const { return std::string(text.data(), strnlen(text.data(), text.size())); }

  void record(Kind k, int s, std::string_view what) noexcept {
    kind = k;
    status = s;
    text.fill('\0');
    std::memcpy(text.data(), what.data(), std::min(what.size(), text.size() - 1));
  }
};

/// Runs step(); an exception it throws is recorded (its kind, status and message) instead of escaping.
template <class F>
StepOutcome attempt(F&& step) noexcept {
  StepOutcome o;
  try {
    step();
  } catch (const multicast_error& e) {
    o.record(StepOutcome::kMulticast, e.status(), e.what());
  } catch (const cuda_error& e) {
    o.record(StepOutcome::kCuda, e.status(), e.what());
  } catch (const std::invalid_argument& e) {
    o.record(StepOutcome::kInvalidArgument, 0, e.what());
  } catch (const timeout_error& e) {
    o.record(StepOutcome::kTimeout, 0, e.what());
  } catch (const std::logic_error& e) {
    o.record(StepOutcome::kLogic, 0, e.what());
  } catch (const std::exception& e) {
    o.record(StepOutcome::kOther, 0, e.what());
  } catch (...) {
    o.record(StepOutcome::kOther, 0, "fiar: unknown exception");
  }
  return o;
}

/// The outcome of a local check: a failure of `kind` with `message` when it is not empty, else success.
inline StepOutcome outcome_of(std::string_view message, StepOutcome::Kind kind = StepOutcome::kInvalidArgument) {
  StepOutcome o;
  if (!message.empty()) o.record(kind, 0, message);
  return o;
}

/// Throws the exception an outcome records, of its type, with `message`.
[[noreturn]] inline void raise(const StepOutcome& o, const std::string& message) {
  switch (o.kind) {
    case StepOutcome::kInvalidArgument: throw std::invalid_argument(message);
    case StepOutcome::kMulticast: throw multicast_error(message, o.status);
    case StepOutcome::kCuda: throw cuda_error(message, o.status);
    case StepOutcome::kTimeout: throw timeout_error(message);
    case StepOutcome::kLogic: throw std::logic_error(message);
    default: throw std::runtime_error(message);
  }
}

/// "fiar: <context>: <message>" with "{rank}" in context replaced by the rank (appended as "failed on rank r" when
/// context has no placeholder).
inline std::string failure_elsewhere(std::string_view context, int rank, const std::string& message) {
  std::string c(context);
  if (const auto at = c.find("{rank}"); at != std::string::npos) {
    c.replace(at, 6, std::to_string(rank));
  } else {
    c += " failed on rank " + std::to_string(rank);
  }
  return "fiar: " + c + ": " + without_fiar_prefix(message);
}

template <class T>
struct Envelope {
  StepOutcome outcome;
  T value;
};
struct NoValue {};

/// Throws on every rank alike when any outcome failed (see the header comment).
template <class E>
void raise_first_failure(const std::vector<E>& all, int me, std::string_view context) {
  for (std::size_t r = 0; r < all.size(); ++r) {
    const StepOutcome& o = all[r].outcome;
    if (!o.failed()) continue;
    const int rank = static_cast<int>(r);
    raise(o, rank == me ? o.message() : failure_elsewhere(context, rank, o.message()));
  }
}

/// Collective: exchanges this rank's outcome and value; returns every rank's value in rank order, or throws on
/// every rank alike for the lowest failing rank.
template <class T, Bootstrap B>
  requires std::is_trivially_copyable_v<T>
std::vector<T> agree(B& boot, const StepOutcome& mine, const T& value, std::string_view context) {
  const auto all = all_gather_value(boot, Envelope<T>{mine, value});
  raise_first_failure(all, boot.rank(), context);
  std::vector<T> values;
  values.reserve(all.size());
  for (const auto& e : all) values.push_back(e.value);
  return values;
}

/// Collective: agree() without a value.
template <Bootstrap B>
void agree(B& boot, const StepOutcome& mine, std::string_view context) {
  (void)agree(boot, mine, NoValue{}, context);
}

/// Collective: runs step() under attempt() on every rank, then agrees.
template <Bootstrap B, class F>
void agree_on(B& boot, std::string_view context, F&& step) {
  agree(boot, attempt(step), context);
}

/// Copies text into a fixed array of a record (truncated, always terminated).
template <std::size_t N>
void copy_text(std::array<char, N>& to, std::string_view from) {
  to.fill('\0');
  std::memcpy(to.data(), from.data(), std::min(from.size(), N - 1));
}

}  // namespace detail
FIAR_END_NAMESPACE
