// Prints one run of --calls_cpu=probe's measurement and its choice:
// "pin_daemon <why> | <figures>".
#include <cstdio>

#include "sandbox/placement_probe.h"

int main() {
  using agentix::sandbox::ChoosePlacement;
  absl::StatusOr<agentix::sandbox::ProbeFigures> figures =
      agentix::sandbox::MeasurePlacement();
  if (!figures.ok()) {
    std::fprintf(stderr, "probe failed: %s\n", figures.status().ToString().c_str());
    return 1;
  }
  const agentix::sandbox::PlacementChoice choice = ChoosePlacement(*figures);
  std::printf("%s (%s) | %s\n", agentix::sandbox::PlacementName(choice.placement),
              choice.why.c_str(), agentix::sandbox::DescribeFigures(*figures).c_str());
  return 0;
}
