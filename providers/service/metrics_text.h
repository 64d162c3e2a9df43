// The controller's MetricsSnapshot in the Prometheus text exposition format,
// version 0.0.4 (what `GET /metrics` answers): one # HELP and # TYPE line
// per family, counters ending in _total, histograms as cumulative
// _bucket{le=...} lines then _sum and _count, label values escaped.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "providers/core/controller.h"

namespace agentix::providers {

// Content-Type of the rendered text.
inline constexpr char kPrometheusContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// Every family, in a fixed order (sandboxes, pools, histograms, counters).
// Families with no sample (no pool yet) still get HELP and TYPE; the
// controller's known counters are always there (0 until they count).
std::string RenderPrometheusText(const MetricsSnapshot& snapshot);

// A double as Prometheus reads it: the shortest text that round-trips,
// "+Inf", "-Inf" or "NaN".
std::string PrometheusNumber(double value);
// A label value with \\, \" and \n escaped.
std::string EscapeLabelValue(absl::string_view value);

}  // namespace agentix::providers
