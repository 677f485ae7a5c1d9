// SPDX-License-Identifier: Apache-2.0
// An unknown backend name in a constant expression.
// expect: unknown_backend_name
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr auto kBackend = fiar::parse_backend("Trtllm");
#else
constexpr auto kBackend = fiar::parse_backend("tensorrt-llm");
#endif
