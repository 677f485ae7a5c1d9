// SPDX-License-Identifier: Apache-2.0
// Backend names, parse_backend, FIAR_ALLREDUCE_BACKEND, and the library version.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cstdlib>
#include <optional>
#include <string>

#include "../common/text.hpp"

using fiar::Backend;

namespace {

using fiar_test::ScopedEnv;

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("expected std::invalid_argument");
  return {};
}

}  // namespace

TEST_CASE("to_string names every backend", "[backend]") {
  CHECK(fiar::to_string(Backend::Auto) == "auto");
  CHECK(fiar::to_string(Backend::Trtllm) == "trtllm");
  CHECK(fiar::to_string(Backend::Mnnvl) == "mnnvl");
  CHECK(fiar::to_string(Backend::Nccl) == "nccl");
}

TEST_CASE("parse_backend accepts the four names in any ASCII case, whitespace ignored", "[backend]") {
  const auto [text, expected] = GENERATE(table<const char*, Backend>({
      {"auto", Backend::Auto},
      {"trtllm", Backend::Trtllm},
      {"mnnvl", Backend::Mnnvl},
      {"nccl", Backend::Nccl},
      {"AUTO", Backend::Auto},
      {"TrtLLM", Backend::Trtllm},
      {"MNNVL", Backend::Mnnvl},
      {"nCcL", Backend::Nccl},
      {"  trtllm", Backend::Trtllm},
      {"mnnvl \t\n", Backend::Mnnvl},
      {"\r\f\vNccl\v ", Backend::Nccl},
      {" Auto ", Backend::Auto},
  }));
  CAPTURE(text);
  CHECK(fiar::parse_backend(text) == expected);
}

TEST_CASE("parse_backend round-trips to_string", "[backend]") {
  for (Backend b : {Backend::Auto, Backend::Trtllm, Backend::Mnnvl, Backend::Nccl}) {
    CHECK(fiar::parse_backend(fiar::to_string(b)) == b);
  }
}

TEST_CASE("parse_backend rejects everything else, naming the value and the accepted names", "[backend]") {
  const std::string bad = GENERATE(as<std::string>{}, "", " ", "\t\n", "tensorrt", "trt llm", "trtllm2", "nvls",
                                   "mnnvl,nccl", "a", "ncc", "Ｎccl", "nccl\x01");
  CAPTURE(bad);
  const std::string msg = message_of([&] { (void)fiar::parse_backend(bad); });
  CHECK(msg.find("auto, trtllm, mnnvl, nccl") != std::string::npos);
  // The value is quoted; control characters are escaped so the message stays one readable line.
  if (bad == "nccl\x01") {
    CHECK(msg.find("'nccl\\x01'") != std::string::npos);
  } else if (bad == "\t\n") {
    CHECK(msg.find("'\\x09\\x0a'") != std::string::npos);
  } else {
    CHECK(msg.find("'" + bad + "'") != std::string::npos);
  }
}

TEST_CASE("backend_from_env: unset or empty means auto", "[env]") {
  SECTION("unset") {
    ScopedEnv env(fiar::backend_env_var, std::nullopt);
    CHECK(fiar::backend_from_env() == Backend::Auto);
  }
  SECTION("empty") {
    ScopedEnv env(fiar::backend_env_var, "");
    CHECK(fiar::backend_from_env() == Backend::Auto);
  }
  SECTION("whitespace only") {
    ScopedEnv env(fiar::backend_env_var, "  \t");
    CHECK(fiar::backend_from_env() == Backend::Auto);
  }
}

TEST_CASE("backend_from_env reads each backend name", "[env]") {
  const auto [text, expected] = GENERATE(table<const char*, Backend>(
      {{"auto", Backend::Auto}, {"trtllm", Backend::Trtllm}, {"MNNVL", Backend::Mnnvl}, {" nccl\n", Backend::Nccl}}));
  ScopedEnv env(fiar::backend_env_var, text);
  CHECK(fiar::backend_from_env() == expected);
}

TEST_CASE("backend_from_env rejects a bad value, naming the variable and the value", "[env]") {
  const std::string bad = GENERATE(as<std::string>{}, "nvls", "trt-llm", "0", "nccl mnnvl");
  ScopedEnv env(fiar::backend_env_var, bad);
  const std::string msg = message_of([] { (void)fiar::backend_from_env(); });
  CHECK(msg.find("FIAR_ALLREDUCE_BACKEND") != std::string::npos);
  CHECK(msg.find("'" + bad + "'") != std::string::npos);
  CHECK(msg.find("auto, trtllm, mnnvl, nccl") != std::string::npos);
}

TEST_CASE("the header version matches the Meson project version", "[version]") {
  const std::string header = fiar::version_string;
  CHECK(header == FIAR_MESON_VERSION);
  CHECK(header == std::to_string(fiar::version_major) + "." + std::to_string(fiar::version_minor) + "." +
                      std::to_string(fiar::version_patch));
}
