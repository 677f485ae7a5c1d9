// SPDX-License-Identifier: Apache-2.0
// Precompiled header of the test executables (Meson's cpp_pch): what nearly every test file includes, parsed once
// per executable instead of once per file (about 6 s of g++ per file at -O0 -g). Test files still include what they
// use; this only makes it cheap. (No include guard: Meson compiles this file on its own and force-includes it.)

#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
