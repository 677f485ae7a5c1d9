// SPDX-License-Identifier: Apache-2.0
// fiar in a translation unit compiled as C++17 (a Meson consumer without cpp_std=c++20): the first error is fiar's
// own, naming the fix, before anything of fiar fails to parse. Compiled with -std=c++17 (test/meson.build).
// expect: \A(?:(?!error:)[\s\S])*error: #error "fiar needs C\+\+20: compile with -std=c\+\+20
#include <fiar/fiar.hpp>
