// SPDX-License-Identifier: Apache-2.0
// fiar/core/version.hpp — the library version.
// Contract: the constants equal the Meson project version (a unit test checks it); every fiar symbol lives in the
// inline namespace fiar::v0_1, so two shared objects built against different fiar versions never exchange kernels
// or types by accident.
#pragma once

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// Library version, kept equal to the Meson project version (checked by a unit test).
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";

FIAR_END_NAMESPACE
