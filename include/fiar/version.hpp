// fiar/version.hpp — the library version and the versioned inline namespace.
// Contract: every fiar symbol lives in fiar::v0_1 (inline), so two shared objects built against
// different fiar versions never exchange kernels or types by accident.
#pragma once

namespace fiar::inline v0_1 {

/// Library version, kept equal to the Meson project version (checked by a unit test).
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";

}  // namespace fiar::inline v0_1
