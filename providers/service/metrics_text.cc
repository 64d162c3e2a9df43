#include "providers/service/metrics_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::providers {
namespace {

constexpr char kPrefix[] = "agentix_providerd_";

struct CounterHelp {
  const char* key;
  const char* help;
};
// Help text of the counters the controller reports; others get a generic
// one, so a counter added there shows up here without a change.
constexpr CounterHelp kCounterHelp[] = {
    {"reaped_ttl", "Sandboxes ended because their TTL expired."},
    {"reaped_idle", "Sandboxes ended because they were idle too long."},
    {"start_failures", "Sandbox starts that failed (START_FAILED, READY_TIMEOUT)."},
    {"backend_lost", "Sandboxes the backend lost (BACKEND_LOST)."},
    {"replays", "CreateSandbox calls answered from a known request_id."},
    {"pool_claims", "Sandboxes handed out from a warm pool."},
    {"pool_cold_fallbacks", "Creates that missed a warm pool and cold-started."},
    {"watch_relists", "Watches refused with OUT_OF_RANGE (client must relist)."},
};

// Metric names allow [a-zA-Z0-9_:]; anything else becomes '_'.
std::string SanitizeName(absl::string_view name) {
  std::string out(name);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == ':';
    if (!ok) c = '_';
  }
  if (out.empty() || (out[0] >= '0' && out[0] <= '9')) out.insert(0, "_");
  return out;
}

void Header(std::string& out, absl::string_view name, absl::string_view help,
            absl::string_view type) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                  type, "\n");
}

void Histo(std::string& out, absl::string_view short_name,
           absl::string_view help, const Histogram& h) {
  const std::string name = absl::StrCat(kPrefix, short_name);
  Header(out, name, help, "histogram");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds_seconds.size(); ++i) {
    if (i < h.counts.size()) cumulative += h.counts[i];
    absl::StrAppend(&out, name, "_bucket{le=\"",
                    PrometheusNumber(h.bounds_seconds[i]), "\"} ", cumulative,
                    "\n");
  }
  // +Inf holds every observation, whatever the per-bucket counts say.
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", h.count, "\n");
  absl::StrAppend(&out, name, "_sum ", PrometheusNumber(h.sum_seconds), "\n");
  absl::StrAppend(&out, name, "_count ", h.count, "\n");
}

}  // namespace

std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", value);  // 10, not 1e+01
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string RenderPrometheusText(const MetricsSnapshot& snapshot) {
  std::string out;
  const std::string sandboxes = absl::StrCat(kPrefix, "sandboxes");
  Header(out, sandboxes, "Sandbox records by backend and phase.", "gauge");
  for (const auto& [key, count] : snapshot.sandboxes) {
    absl::StrAppend(&out, sandboxes, "{backend=\"", EscapeLabelValue(key.first),
                    "\",phase=\"", EscapeLabelValue(key.second), "\"} ", count,
                    "\n");
  }
  const std::pair<const char*, const char*> pool_gauges[] = {
      {"pool_ready", "Ready (started, unclaimed) members of a warm pool."},
      {"pool_creating", "Members of a warm pool that are starting."},
      {"pool_total", "Live members of a warm pool (starting and ready)."},
  };
  for (const auto& [short_name, help] : pool_gauges) {
    const std::string name = absl::StrCat(kPrefix, short_name);
    Header(out, name, help, "gauge");
    for (const auto& [pool, status] : snapshot.pools) {
      const int32_t value = short_name == pool_gauges[0].first ? status.ready()
                            : short_name == pool_gauges[1].first
                                ? status.creating()
                                : status.total();
      absl::StrAppend(&out, name, "{pool=\"", EscapeLabelValue(pool), "\"} ",
                      value, "\n");
    }
  }
  Histo(out, "create_seconds",
        "CreateSandbox to READY of cold starts, in seconds.",
        snapshot.create_seconds);
  Histo(out, "acquire_seconds",
        "CreateSandbox to READY of warm-pool claims, in seconds.",
        snapshot.acquire_seconds);
  Histo(out, "delete_seconds", "DeleteSandbox to TERMINATED, in seconds.",
        snapshot.delete_seconds);
  // The known counters always (0 until they happen, so dashboards see the
  // series from the start), then any other the controller reports.
  auto counter = [&](absl::string_view key, absl::string_view help,
                     uint64_t value) {
    const std::string name =
        absl::StrCat(kPrefix, SanitizeName(key), "_total");
    Header(out, name, help, "counter");
    absl::StrAppend(&out, name, " ", value, "\n");
  };
  for (const auto& known : kCounterHelp) {
    auto it = snapshot.counters.find(known.key);
    counter(known.key, known.help,
            it == snapshot.counters.end() ? 0 : it->second);
  }
  for (const auto& [key, value] : snapshot.counters) {
    bool is_known = false;
    for (const auto& known : kCounterHelp) is_known |= key == known.key;
    if (!is_known) counter(key, absl::StrCat("Count of ", key, " events."), value);
  }
  return out;
}

}  // namespace agentix::providers
