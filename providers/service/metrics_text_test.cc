#include "providers/service/metrics_text.h"

#include <catch2/catch.hpp>
#include <limits>
#include <string>

namespace agentix::providers {
namespace {

constexpr char kKnownCounters[] =
    "# HELP agentix_providerd_reaped_ttl_total Sandboxes ended because their "
    "TTL expired.\n"
    "# TYPE agentix_providerd_reaped_ttl_total counter\n"
    "agentix_providerd_reaped_ttl_total 3\n"
    "# HELP agentix_providerd_reaped_idle_total Sandboxes ended because they "
    "were idle too long.\n"
    "# TYPE agentix_providerd_reaped_idle_total counter\n"
    "agentix_providerd_reaped_idle_total 0\n"
    "# HELP agentix_providerd_start_failures_total Sandbox starts that failed "
    "(START_FAILED, READY_TIMEOUT).\n"
    "# TYPE agentix_providerd_start_failures_total counter\n"
    "agentix_providerd_start_failures_total 0\n"
    "# HELP agentix_providerd_backend_lost_total Sandboxes the backend lost "
    "(BACKEND_LOST).\n"
    "# TYPE agentix_providerd_backend_lost_total counter\n"
    "agentix_providerd_backend_lost_total 0\n"
    "# HELP agentix_providerd_replays_total CreateSandbox calls answered from "
    "a known request_id.\n"
    "# TYPE agentix_providerd_replays_total counter\n"
    "agentix_providerd_replays_total 0\n"
    "# HELP agentix_providerd_pool_claims_total Sandboxes handed out from a "
    "warm pool.\n"
    "# TYPE agentix_providerd_pool_claims_total counter\n"
    "agentix_providerd_pool_claims_total 7\n"
    "# HELP agentix_providerd_pool_cold_fallbacks_total Creates that missed a "
    "warm pool and cold-started.\n"
    "# TYPE agentix_providerd_pool_cold_fallbacks_total counter\n"
    "agentix_providerd_pool_cold_fallbacks_total 0\n"
    "# HELP agentix_providerd_watch_relists_total Watches refused with "
    "OUT_OF_RANGE (client must relist).\n"
    "# TYPE agentix_providerd_watch_relists_total counter\n"
    "agentix_providerd_watch_relists_total 0\n";

TEST_CASE("Prometheus text of a full snapshot", "[metrics]") {
  MetricsSnapshot s;
  s.sandboxes[{"local", "READY"}] = 2;
  s.sandboxes[{"local", "TERMINATED"}] = 5;
  pb::WarmPoolStatus pool;
  pool.set_ready(3);
  pool.set_creating(1);
  pool.set_total(4);
  s.pools["py\"3\\11"] = pool;  // label value escaping
  s.create_seconds.bounds_seconds = {0.05, 0.1, 0.25};
  s.create_seconds.counts = {1, 2, 0, 1};  // +Inf last
  s.create_seconds.sum_seconds = 0.5;
  s.create_seconds.count = 4;
  s.counters["reaped_ttl"] = 3;
  s.counters["pool_claims"] = 7;
  s.counters["odd-name"] = 1;

  const std::string expected =
      std::string(
          "# HELP agentix_providerd_sandboxes Sandbox records by backend and "
          "phase.\n"
          "# TYPE agentix_providerd_sandboxes gauge\n"
          "agentix_providerd_sandboxes{backend=\"local\",phase=\"READY\"} 2\n"
          "agentix_providerd_sandboxes{backend=\"local\",phase=\"TERMINATED\"} "
          "5\n"
          "# HELP agentix_providerd_pool_ready Ready (started, unclaimed) "
          "members of a warm pool.\n"
          "# TYPE agentix_providerd_pool_ready gauge\n"
          "agentix_providerd_pool_ready{pool=\"py\\\"3\\\\11\"} 3\n"
          "# HELP agentix_providerd_pool_creating Members of a warm pool that "
          "are starting.\n"
          "# TYPE agentix_providerd_pool_creating gauge\n"
          "agentix_providerd_pool_creating{pool=\"py\\\"3\\\\11\"} 1\n"
          "# HELP agentix_providerd_pool_total Live members of a warm pool "
          "(starting and ready).\n"
          "# TYPE agentix_providerd_pool_total gauge\n"
          "agentix_providerd_pool_total{pool=\"py\\\"3\\\\11\"} 4\n"
          "# HELP agentix_providerd_create_seconds CreateSandbox to READY of "
          "cold starts, in seconds.\n"
          "# TYPE agentix_providerd_create_seconds histogram\n"
          "agentix_providerd_create_seconds_bucket{le=\"0.05\"} 1\n"
          "agentix_providerd_create_seconds_bucket{le=\"0.1\"} 3\n"
          "agentix_providerd_create_seconds_bucket{le=\"0.25\"} 3\n"
          "agentix_providerd_create_seconds_bucket{le=\"+Inf\"} 4\n"
          "agentix_providerd_create_seconds_sum 0.5\n"
          "agentix_providerd_create_seconds_count 4\n"
          "# HELP agentix_providerd_acquire_seconds CreateSandbox to READY of "
          "warm-pool claims, in seconds.\n"
          "# TYPE agentix_providerd_acquire_seconds histogram\n"
          "agentix_providerd_acquire_seconds_bucket{le=\"+Inf\"} 0\n"
          "agentix_providerd_acquire_seconds_sum 0\n"
          "agentix_providerd_acquire_seconds_count 0\n"
          "# HELP agentix_providerd_delete_seconds DeleteSandbox to "
          "TERMINATED, in seconds.\n"
          "# TYPE agentix_providerd_delete_seconds histogram\n"
          "agentix_providerd_delete_seconds_bucket{le=\"+Inf\"} 0\n"
          "agentix_providerd_delete_seconds_sum 0\n"
          "agentix_providerd_delete_seconds_count 0\n") +
      kKnownCounters +
      "# HELP agentix_providerd_odd_name_total Count of odd-name events.\n"
      "# TYPE agentix_providerd_odd_name_total counter\n"
      "agentix_providerd_odd_name_total 1\n";
  CHECK(RenderPrometheusText(s) == expected);
}

TEST_CASE("Empty snapshot still declares every family", "[metrics]") {
  const std::string text = RenderPrometheusText(MetricsSnapshot{});
  CHECK(text.find("# TYPE agentix_providerd_sandboxes gauge\n# HELP") !=
        std::string::npos);
  CHECK(text.find("# TYPE agentix_providerd_pool_total gauge\n") !=
        std::string::npos);
  CHECK(text.find("agentix_providerd_watch_relists_total 0\n") !=
        std::string::npos);
  CHECK(text.back() == '\n');
}

TEST_CASE("Numbers and label values as Prometheus reads them", "[metrics]") {
  CHECK(PrometheusNumber(0.1) == "0.1");
  CHECK(PrometheusNumber(0.005) == "0.005");
  CHECK(PrometheusNumber(2.5) == "2.5");
  CHECK(PrometheusNumber(10) == "10");
  CHECK(PrometheusNumber(0.1 + 0.2) == "0.30000000000000004");
  CHECK(PrometheusNumber(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(PrometheusNumber(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(PrometheusNumber(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(EscapeLabelValue("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
}

}  // namespace
}  // namespace agentix::providers
