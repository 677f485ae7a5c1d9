// SPDX-License-Identifier: Apache-2.0
// resolve_backend, check_topology and the policy facts, against a reference written from the rules.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <optional>
#include <string>
#include <vector>

#include "../common/text.hpp"

using fiar::Backend;
using fiar::Resolution;
using fiar::Topology;

namespace {

// The backend rules restated independently of fiar's implementation; nullopt = rejected.
bool reference_malformed(const Topology& t) {
  return t.world_size < 1 || t.rank < 0 || t.rank >= t.world_size || t.node_count < 1 || t.node_count > t.world_size ||
         t.arch < 0;
}
bool arch_ok(const Topology& t) { return t.arch == 0 || t.arch >= 90; }
bool reference_trtllm_ok(const Topology& t) {
  return t.node_count == 1 && t.world_size <= 16 && t.node_peer_access && arch_ok(t);
}
bool reference_mnnvl_ok(const Topology& t) { return t.multicast_supported && t.world_size <= 64 && arch_ok(t); }

std::optional<Resolution> reference_resolve(Backend requested, const Topology& t) {
  switch (requested) {
    case Backend::Auto:
      if (reference_mnnvl_ok(t)) return Resolution{Backend::Mnnvl, reference_trtllm_ok(t)};
      if (reference_trtllm_ok(t)) return Resolution{Backend::Trtllm, false};
      return Resolution{Backend::Nccl, false};
    case Backend::Trtllm:
      return reference_trtllm_ok(t) ? std::optional(Resolution{Backend::Trtllm, false}) : std::nullopt;
    case Backend::Mnnvl: return reference_mnnvl_ok(t) ? std::optional(Resolution{Backend::Mnnvl, false}) : std::nullopt;
    case Backend::Nccl: return Resolution{Backend::Nccl, false};
  }
  return std::nullopt;
}

std::string rejection_message(Backend b, const Topology& t) {
  try {
    (void)fiar::resolve_backend(b, t);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("expected std::invalid_argument for backend " << fiar::to_string(b) << " on " << fiar::to_string(t));
  return {};
}

using fiar_test::contains;

Topology topo(int world, int nodes, bool multicast, bool peer = true, int arch = 0, bool fabric = false) {
  return Topology{.world_size = world,
                  .rank = 0,
                  .node_count = nodes,
                  .multicast_supported = multicast,
                  .fabric_handles_supported = fabric,
                  .node_peer_access = peer,
                  .arch = arch};
}

}  // namespace

TEST_CASE("resolve_backend matches the reference on every well-formed topology of the grid", "[resolve]") {
  const Backend requested = GENERATE(Backend::Auto, Backend::Trtllm, Backend::Mnnvl, Backend::Nccl);
  int checked = 0;
  for (int world = 1; world <= 72; ++world) {
    for (int nodes : {1, 2, 3, 4, 8, 9, 18}) {
      if (nodes > world) continue;
      for (int arch : {0, 80, 89, 90, 100, 103, 120}) {
        for (int bits = 0; bits < 8; ++bits) {
          const Topology t = topo(world, nodes, bits & 1, bits & 2, arch, bits & 4);
          const auto expected = reference_resolve(requested, t);
          CAPTURE(fiar::to_string(requested), fiar::to_string(t));
          if (expected) {
            REQUIRE(fiar::resolve_backend(requested, t) == *expected);
          } else {
            REQUIRE_THROWS_AS(fiar::resolve_backend(requested, t), std::invalid_argument);
          }
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 10000);
}

TEST_CASE("rank does not change the choice", "[resolve]") {
  for (int rank = 0; rank < 8; ++rank) {
    Topology t = topo(8, 2, true);
    t.rank = rank;
    CHECK(fiar::resolve_backend(Backend::Auto, t) == Resolution{Backend::Mnnvl, false});
    CHECK_THROWS_AS(fiar::resolve_backend(Backend::Trtllm, t), std::invalid_argument);
  }
}

TEST_CASE("trtllm: one node versus two", "[resolve]") {
  CHECK(fiar::resolve_backend(Backend::Trtllm, topo(8, 1, false)) == Resolution{Backend::Trtllm, false});
  CHECK(fiar::resolve_backend(Backend::Trtllm, topo(8, 1, true)) == Resolution{Backend::Trtllm, false});
  CHECK_THROWS_AS(fiar::resolve_backend(Backend::Trtllm, topo(8, 2, false)), std::invalid_argument);
  CHECK_THROWS_AS(fiar::resolve_backend(Backend::Trtllm, topo(16, 2, true)), std::invalid_argument);
}

TEST_CASE("trtllm across nodes: the message names trtllm, the node count and the fix", "[resolve]") {
  const int nodes = GENERATE(2, 3, 4);
  SECTION("with multicast the fix is mnnvl") {
    const std::string msg = rejection_message(Backend::Trtllm, topo(4 * nodes, nodes, true));
    CHECK(contains(msg, "'trtllm'"));
    CHECK(contains(msg, std::to_string(nodes) + " nodes"));
    CHECK(contains(msg, "Fix: use 'mnnvl'"));
    CHECK(contains(msg, "FIAR_ALLREDUCE_BACKEND=mnnvl"));
  }
  SECTION("without multicast the fix is nccl") {
    const std::string msg = rejection_message(Backend::Trtllm, topo(4 * nodes, nodes, false));
    CHECK(contains(msg, "'trtllm'"));
    CHECK(contains(msg, std::to_string(nodes) + " nodes"));
    CHECK(contains(msg, "Fix: use 'nccl'"));
    CHECK(contains(msg, "FIAR_ALLREDUCE_BACKEND=nccl"));
    CHECK_FALSE(contains(msg, "Fix: use 'mnnvl'"));
  }
}

TEST_CASE("trtllm world sizes: every size from 1 to 16, none beyond", "[resolve]") {
  for (int world = 1; world <= 16; ++world) {
    CAPTURE(world);
    CHECK(fiar::resolve_backend(Backend::Trtllm, topo(world, 1, false)).backend == Backend::Trtllm);
    CHECK(fiar::resolve_backend(Backend::Auto, topo(world, 1, false)).backend == Backend::Trtllm);
  }
  for (int world : {17, 18, 24, 32, 64, 65, 1000}) {
    CAPTURE(world);
    const std::string msg = rejection_message(Backend::Trtllm, topo(world, 1, false));
    CHECK(contains(msg, "world_size " + std::to_string(world)));
    CHECK(contains(msg, "1 to 16"));
    CHECK(contains(msg, "Fix: use 'nccl'"));
    CHECK(fiar::resolve_backend(Backend::Auto, topo(world, 1, false)).backend == Backend::Nccl);
  }
}

TEST_CASE("trtllm needs peer access between the ranks of the node", "[resolve]") {
  const std::string msg = rejection_message(Backend::Trtllm, topo(8, 1, false, /*peer=*/false));
  CHECK(contains(msg, "peer access"));
  CHECK(contains(msg, "node_peer_access = false"));
  CHECK(contains(msg, "Fix: use 'nccl'"));
  CHECK(fiar::resolve_backend(Backend::Auto, topo(8, 1, false, false)) == Resolution{Backend::Nccl, false});
  // Multicast without peer access (e.g. an NVLink domain whose ranks sit in separate containers): mnnvl, no fallback.
  CHECK(fiar::resolve_backend(Backend::Auto, topo(8, 1, true, false)) == Resolution{Backend::Mnnvl, false});
}

TEST_CASE("mnnvl needs multicast; the message names it and the alternatives", "[resolve]") {
  SECTION("one node with peer access: trtllm is the alternative") {
    const std::string msg = rejection_message(Backend::Mnnvl, topo(8, 1, false));
    CHECK(contains(msg, "'mnnvl'"));
    CHECK(contains(msg, "NVLink multicast"));
    CHECK(contains(msg, "multicast_supported = false"));
    CHECK(contains(msg, "Fix: use 'trtllm'"));
    CHECK(contains(msg, "'nccl' also works"));
  }
  SECTION("two nodes: nccl is the alternative") {
    const std::string msg = rejection_message(Backend::Mnnvl, topo(16, 2, false));
    CHECK(contains(msg, "multicast_supported = false"));
    CHECK(contains(msg, "Fix: use 'nccl'"));
  }
}

TEST_CASE("mnnvl world sizes 1 to 64", "[resolve]") {
  for (int world : {1, 2, 4, 6, 8, 16, 32, 36, 64}) {
    CHECK(fiar::resolve_backend(Backend::Mnnvl, topo(world, 1, true)).backend == Backend::Mnnvl);
  }
  const std::string msg = rejection_message(Backend::Mnnvl, topo(72, 18, true));
  CHECK(contains(msg, "world_size 72"));
  CHECK(contains(msg, "1 to 64"));
  CHECK(fiar::resolve_backend(Backend::Auto, topo(72, 18, true)) == Resolution{Backend::Nccl, false});
}

TEST_CASE("custom backends need sm_90 or newer when the architecture is known", "[resolve]") {
  for (Backend b : {Backend::Trtllm, Backend::Mnnvl}) {
    const std::string msg = rejection_message(b, topo(8, 1, true, true, 80));
    CHECK(contains(msg, "sm_90 or newer"));
    CHECK(contains(msg, "sm_80"));
    CHECK(contains(msg, "Fix: use 'nccl'"));
    CHECK(fiar::resolve_backend(b, topo(8, 1, true, true, 90)).backend == b);
    CHECK(fiar::resolve_backend(b, topo(8, 1, true, true, 0)).backend == b);
  }
  CHECK(fiar::resolve_backend(Backend::Auto, topo(8, 1, true, true, 80)) == Resolution{Backend::Nccl, false});
}

TEST_CASE("nccl accepts every well-formed topology", "[resolve]") {
  for (const Topology& t : {topo(1, 1, false), topo(8, 1, true), topo(16, 2, false, false, 70), topo(512, 64, true)}) {
    CHECK(fiar::resolve_backend(Backend::Nccl, t) == Resolution{Backend::Nccl, false});
  }
}

TEST_CASE("auto: mnnvl first, trtllm fallback only where trtllm could run", "[resolve]") {
  CHECK(fiar::resolve_backend(Backend::Auto, topo(8, 1, true)) == Resolution{Backend::Mnnvl, true});
  CHECK(fiar::resolve_backend(Backend::Auto, topo(16, 2, true)) == Resolution{Backend::Mnnvl, false});
  CHECK(fiar::resolve_backend(Backend::Auto, topo(32, 1, true)) == Resolution{Backend::Mnnvl, false});
  CHECK(fiar::resolve_backend(Backend::Auto, topo(8, 1, false)) == Resolution{Backend::Trtllm, false});
  CHECK(fiar::resolve_backend(Backend::Auto, topo(16, 2, false)) == Resolution{Backend::Nccl, false});
  CHECK(fiar::resolve_backend(Backend::Auto, topo(1, 1, false)) == Resolution{Backend::Trtllm, false});
}

TEST_CASE("an explicit choice is validated, never replaced, and never allows a fallback", "[resolve]") {
  const Topology t = topo(8, 1, true);
  CHECK(fiar::resolve_backend(Backend::Trtllm, t) == Resolution{Backend::Trtllm, false});
  CHECK(fiar::resolve_backend(Backend::Mnnvl, t) == Resolution{Backend::Mnnvl, false});
  CHECK(fiar::resolve_backend(Backend::Nccl, t) == Resolution{Backend::Nccl, false});
}

TEST_CASE("a malformed topology is rejected for every requested backend, naming the field", "[resolve]") {
  const auto [t, field, value] = GENERATE(table<Topology, std::string, std::string>({
      {Topology{.world_size = 0}, "world_size", "0"},
      {Topology{.world_size = -3}, "world_size", "-3"},
      {Topology{.world_size = 4, .rank = 4}, "rank", "4"},
      {Topology{.world_size = 4, .rank = -1}, "rank", "-1"},
      {Topology{.world_size = 4, .rank = 0, .node_count = 0}, "node_count", "0"},
      {Topology{.world_size = 4, .rank = 0, .node_count = 5}, "node_count", "5"},
      {Topology{.world_size = 4, .arch = -90}, "arch", "-90"},
  }));
  const Backend b = GENERATE(Backend::Auto, Backend::Trtllm, Backend::Mnnvl, Backend::Nccl);
  REQUIRE(reference_malformed(t));
  const std::string msg = rejection_message(b, t);
  CHECK(contains(msg, "malformed topology"));
  CHECK(contains(msg, field + " = " + value));
  CHECK_THROWS_AS(fiar::validate_topology(t), std::invalid_argument);
}

TEST_CASE("check_topology applies the rules of the policy's backend", "[policy]") {
  const Topology two_nodes = topo(16, 2, false);
  CHECK_THROWS_AS(fiar::check_topology<fiar::TrtllmPolicy>(two_nodes), std::invalid_argument);
  CHECK_THROWS_AS(fiar::check_topology<fiar::MnnvlPolicy>(two_nodes), std::invalid_argument);
  CHECK_NOTHROW(fiar::check_topology<fiar::NcclPolicy>(two_nodes));
  CHECK_NOTHROW(fiar::check_topology<fiar::TrtllmPolicy>(topo(8, 1, false)));
  CHECK_NOTHROW(fiar::check_topology<fiar::MnnvlPolicy>(topo(16, 2, true)));
  CHECK_THROWS_AS(fiar::check_topology<fiar::NcclPolicy>(Topology{.world_size = 0}), std::invalid_argument);
}

TEST_CASE("why_not explains each rejection and is empty when the backend can run", "[policy]") {
  CHECK(fiar::why_not(Backend::Trtllm, topo(8, 1, false)).empty());
  CHECK(contains(fiar::why_not(Backend::Trtllm, topo(16, 2, false)), "2 nodes"));
  CHECK(contains(fiar::why_not(Backend::Trtllm, topo(32, 1, false)), "world_size 32"));
  CHECK(contains(fiar::why_not(Backend::Trtllm, topo(8, 1, false, false)), "map each other's memory"));
  CHECK(contains(fiar::why_not(Backend::Mnnvl, topo(8, 1, false)), "multicast"));
  CHECK(contains(fiar::why_not(Backend::Mnnvl, topo(8, 1, true, true, 80)), "sm_80"));
  CHECK(fiar::why_not(Backend::Nccl, topo(8, 2, false)).empty());
}

TEST_CASE("best_alternative prefers mnnvl, then trtllm, then nccl", "[policy]") {
  CHECK(fiar::best_alternative(Backend::Trtllm, topo(8, 1, true)) == Backend::Mnnvl);
  CHECK(fiar::best_alternative(Backend::Mnnvl, topo(8, 1, true)) == Backend::Trtllm);
  CHECK(fiar::best_alternative(Backend::Mnnvl, topo(8, 2, true)) == Backend::Nccl);
  CHECK(fiar::best_alternative(Backend::Trtllm, topo(8, 2, false)) == Backend::Nccl);
}

TEST_CASE("a Backend value outside the enumeration is rejected, naming it, not run as some backend", "[resolve]") {
  const auto bad = static_cast<fiar::Backend>(9);
  CHECK_FALSE(fiar::is_valid(bad));
  CHECK(fiar::to_string(bad) == "invalid");
  const fiar::Topology topo{.world_size = 2};
  try {
    (void)fiar::resolve_backend(bad, topo);
    FAIL("resolve_backend accepted Backend value 9");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("Backend value 9 is not a backend; allowed: auto, trtllm, mnnvl, nccl") !=
          std::string::npos);
  }
  CHECK(fiar::rejection_for(bad, topo) == fiar::Rejection::none);  // no rule to name: resolve_backend rejects it
  for (fiar::Backend b : {fiar::Backend::Auto, fiar::Backend::Trtllm, fiar::Backend::Mnnvl, fiar::Backend::Nccl}) {
    CHECK(fiar::is_valid(b));
    CHECK(fiar::parse_backend(fiar::to_string(b)) == b);
  }
}
