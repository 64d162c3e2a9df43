"""Smoke test: wake_ab (the wake-up settings' A/B) runs two short rounds and reports
every setting, its ratios to `off` and the floors. No timing thresholds: it must
pass on a slow or busy machine."""

import os
import sys
import unittest

from smoke_checks import daemon_share, positive_numbers, run_report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
FIGURES = ("python_noop_p50_us", "python_noop_p99_us", "python_noop_cpu_us_total",
           "python_noop_cpu_us_worker", "python_c64_calls_per_s",
           "python_c64_cpu_us_total", "cc_noop_p50_us", "cc_noop_p99_us", "cc_cpu_us_client",
           "cc_cpu_us_daemon", "cc_cpu_us_worker")


class WakeAbSmokeTest(unittest.TestCase):
    def test_two_short_rounds_report_every_setting_and_floor(self):
        binary = os.path.join(BENCH_DIR, "wake_ab")
        report = run_report(self, [sys.executable, binary, "--rounds", "2", "--calls", "100",
                                   "--c64-seconds", "0.3", "--settings", "off,pin,spin"],
                            timeout_s=600, echo=True)
        self.assertNotIn("errors", report)
        self.assertEqual(report["rounds"], 2)
        self.assertEqual(sorted(report["settings"]), ["off", "pin", "spin"])
        for name, entry in report["settings"].items():
            self.assertEqual(entry["runs"], 2, name)
            positive_numbers(self, entry["medians"], FIGURES, f"{name}.medians")
            # Its ratio to `off` is null when both are 0 (direct calls).
            daemon_share(self, entry["medians"]["python_noop_cpu_us_daemon"],
                         f"{name}.medians.python_noop_cpu_us_daemon")
            positive_numbers(self, entry["over_floors"],
                             ("python_noop_p50_over_floor", "cc_noop_p50_over_floor_grpc",
                              "cc_noop_p50_over_floor_relay_pinned"), f"{name}.over_floors")
            self.assertEqual(sorted(entry["targets"]), [
                "cc_noop_p50_at_most_1_5x_floor_grpc", "python_noop_p50_at_most_100us",
                "python_noop_p50_at_most_2_5x_floor"], name)
            for met in entry["targets"].values():
                self.assertIsInstance(met, bool, name)
            if name != "off":
                positive_numbers(self, entry["over_off"], FIGURES, f"{name}.over_off")
        self.assertNotIn("over_off", report["settings"]["off"])
        positive_numbers(self, {k: v["noop_p50_us"] for k, v in report["floors"].items()},
                         ("floor", "floor_relay", "floor_grpc", "floor_pinned",
                          "floor_relay_pinned"), "floors")


if __name__ == "__main__":
    unittest.main()
