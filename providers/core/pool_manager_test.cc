#include "providers/core/pool_manager.h"

#include <catch2/catch.hpp>

#include "providers/core/errors.h"

namespace agentix::providers {
namespace {

TEST_CASE("Pool key: env, labels and ttl are not in it; image, resources, network are",
          "[pool]") {
  pb::SandboxSpec a;
  a.set_image("host");
  a.mutable_bundle()->set_path("/b");
  pb::SandboxSpec b = a;
  (*b.mutable_env())["X"] = "1";
  b.mutable_ttl()->set_seconds(60);
  b.mutable_idle_timeout()->set_seconds(5);
  b.set_warm_pool("p");
  CHECK(PoolKey(a, "local") == PoolKey(b, "local"));
  CHECK(PoolKeyDiff(a, b, "local") == "");
  b.set_backend("local");  // the default, spelled out
  CHECK(PoolKey(a, "local") == PoolKey(b, "local"));
  pb::SandboxSpec c = a;
  c.mutable_resources()->set_memory_bytes(1 << 30);
  CHECK(PoolKey(a, "local") != PoolKey(c, "local"));
  CHECK(PoolKeyDiff(a, c, "local") == "resources");
  c = a;
  c.set_image("oci:/x");
  CHECK(PoolKeyDiff(a, c, "local") == "image");
  c = a;
  c.mutable_bundle()->set_digest("sha256:1");
  CHECK(PoolKeyDiff(a, c, "local") == "bundle");
  c = a;
  c.mutable_network()->set_mode(pb::Network::HOST);
  CHECK(PoolKeyDiff(a, c, "local") == "network");
  c = a;
  c.set_backend("docker");
  CHECK(PoolKeyDiff(a, c, "local") == "backend");
}

TEST_CASE("Pool sizing: creating, min_ready and max_total bound the starts", "[pool]") {
  pb::WarmPool pool;
  pool.set_name("p");
  pool.mutable_template_()->set_image("host");
  pool.set_min_ready(20);
  pool.set_max_total(30);
  REQUIRE(ValidateAndDefaultPool(&pool).ok());
  CHECK(pool.max_creating() == 4);
  CHECK(MembersToStart(pool, {0, 0, 0}) == 4);
  CHECK(MembersToStart(pool, {18, 0, 0}) == 2);
  CHECK(MembersToStart(pool, {16, 4, 0}) == 0);
  CHECK(MembersToStart(pool, {20, 0, 0}) == 0);
  // Stale members do not count toward min_ready but do toward max_total.
  CHECK(MembersToStart(pool, {20, 0, 20}) == 4);
  CHECK(MembersToStart(pool, {28, 0, 20}) == 2);
  CHECK(MembersToStart(pool, {30, 0, 20}) == 0);
  pb::WarmPool bad = pool;
  bad.set_max_total(10);
  CHECK(ReasonOf(ValidateAndDefaultPool(&bad)) == kReasonInvalidSpec);
  bad = pool;
  bad.set_name("Bad_Name");
  CHECK(ValidateAndDefaultPool(&bad).code() == absl::StatusCode::kInvalidArgument);
  bad = pool;
  bad.clear_template_();
  CHECK(ValidateAndDefaultPool(&bad).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Pool back-off: none before 3 failures, then doubling up to 5 minutes", "[pool]") {
  CHECK(PoolBackoff(0) == absl::ZeroDuration());
  CHECK(PoolBackoff(2) == absl::ZeroDuration());
  CHECK(PoolBackoff(3) == absl::Seconds(1));
  CHECK(PoolBackoff(4) == absl::Seconds(2));
  CHECK(PoolBackoff(12) == absl::Minutes(5));
  CHECK(PoolBackoff(100) == absl::Minutes(5));
}

}  // namespace
}  // namespace agentix::providers
