// SPDX-License-Identifier: Apache-2.0
// Topology defaults, node counting from per-rank identities, and the topology's description.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <set>
#include <string>
#include <string_view>
#include <vector>

using fiar::Topology;

namespace {

// Reference: the number of distinct identities, through std::set.
int reference_count(const std::vector<std::string>& ids) {
  return static_cast<int>(std::set(ids.begin(), ids.end()).size());
}

int count(const std::vector<std::string>& ids) {
  std::vector<std::string_view> views(ids.begin(), ids.end());
  return fiar::count_nodes(views);
}

}  // namespace

TEST_CASE("Topology defaults describe one rank on one node with peer access and nothing else", "[topology]") {
  constexpr Topology t{};
  STATIC_REQUIRE(t.world_size == 1);
  STATIC_REQUIRE(t.rank == 0);
  STATIC_REQUIRE(t.node_count == 1);
  STATIC_REQUIRE_FALSE(t.multicast_supported);
  STATIC_REQUIRE_FALSE(t.fabric_handles_supported);
  STATIC_REQUIRE(t.node_peer_access);
  STATIC_REQUIRE(t.arch == 0);
}

TEST_CASE("count_nodes on hand-written layouts", "[topology]") {
  CHECK(count({}) == 0);
  CHECK(count({"a"}) == 1);
  CHECK(count({"a", "a", "a", "a"}) == 1);
  CHECK(count({"a", "b"}) == 2);
  CHECK(count({"a", "a", "b", "b"}) == 2);
  CHECK(count({"a", "b", "a", "b"}) == 2);  // interleaved placement
  CHECK(count({"n0", "n1", "n2", "n3", "n0"}) == 4);
  CHECK(count({"node", "Node", "node "}) == 3);  // byte-exact: no case folding or trimming
}

TEST_CASE("count_nodes is usable in constant expressions", "[topology]") {
  constexpr std::string_view ids[] = {"x", "y", "x"};
  STATIC_REQUIRE(fiar::count_nodes(ids) == 2);
}

TEST_CASE("count_nodes equals the number of distinct identities on generated layouts", "[topology]") {
  const int world = GENERATE(1, 2, 7, 16, 72);
  const int distinct = GENERATE(1, 2, 3, 9);
  const int stride = GENERATE(1, 5);
  std::vector<std::string> ids;
  for (int r = 0; r < world; ++r) ids.push_back("boot:" + std::to_string((r * stride) % distinct));
  CAPTURE(world, distinct, stride);
  CHECK(count(ids) == reference_count(ids));
}

TEST_CASE("node_index_of_ranks numbers nodes in order of their lowest rank", "[topology]") {
  const std::vector<std::string_view> ids = {"b", "a", "b", "c", "a"};
  CHECK(fiar::node_index_of_ranks(ids) == std::vector<int>{0, 1, 0, 2, 1});
}

TEST_CASE("to_string describes every field", "[topology]") {
  const Topology t{.world_size = 16,
                   .rank = 3,
                   .node_count = 2,
                   .multicast_supported = true,
                   .fabric_handles_supported = true,
                   .node_peer_access = false,
                   .arch = 100};
  CHECK(fiar::to_string(t) ==
        "world_size 16, rank 3, 2 nodes, multicast yes, fabric handles yes, node peer access no, arch sm_100");
  CHECK(fiar::to_string(Topology{}) ==
        "world_size 1, rank 0, 1 node, multicast no, fabric handles no, node peer access yes, arch unknown");
}
