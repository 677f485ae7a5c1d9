// SPDX-License-Identifier: Apache-2.0
// The constant-expression checks, compiled by the host compiler (a failure is a build failure).
#include "static_checks.hpp"
