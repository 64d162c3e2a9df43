#include "sandbox/adopted_worker.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

TEST_CASE("The --adopt_worker value round-trips", "[adopt]") {
  AdoptedWorker worker{4242, "0a1b2c3d", 5, 6, 7};
  const std::string flag = FormatAdoptFlag(worker);
  CHECK(flag == "pid=4242,id=0a1b2c3d,channel=5,stderr=6,payload=7");
  auto parsed = ParseAdoptFlag(flag);
  REQUIRE(parsed.ok());
  CHECK(parsed->pid == 4242);
  CHECK(parsed->worker_id == "0a1b2c3d");
  CHECK(parsed->channel_fd == 5);
  CHECK(parsed->stderr_fd == 6);
  CHECK(parsed->payload_fd == 7);

  worker.payload_fd = -1;  // no payload area
  parsed = ParseAdoptFlag(FormatAdoptFlag(worker));
  REQUIRE(parsed.ok());
  CHECK(parsed->payload_fd == -1);
}

TEST_CASE("A bad --adopt_worker value is a clear error", "[adopt]") {
  for (const char* value :
       {"", "pid=1", "pid=12,id=x,channel=5", "pid=0,id=x,channel=5,stderr=6",
        "pid=12,id=x,channel=1,stderr=6", "pid=12,id=x,channel=5,stderr=six",
        "pid=12,id=,channel=5,stderr=6", "pid=12,id=x,channel=5,stderr=6,color=3",
        "pid=12,pid=13,id=x,channel=5,stderr=6", "pid=12,id=x,channel=5,stderr"}) {
    auto parsed = ParseAdoptFlag(value);
    INFO(value);
    REQUIRE(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(parsed.status().message()),
               Catch::Contains("--adopt_worker"));
  }
}

}  // namespace
}  // namespace agentix::sandbox
