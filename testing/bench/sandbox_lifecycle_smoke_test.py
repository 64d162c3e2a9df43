"""Smoke test: the lifecycle benchmark runs (--quick) and reports sane numbers.

Builds examples/hello once, starts three sandboxes (busybox root) with the local
provider, and checks the LAST stdout line: every key present, positive numbers.
No timing thresholds: it must pass on a slow or busy machine.
"""

import os
import sys
import unittest

from smoke_checks import positive_numbers, run_report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
HEADLINE = ("create_to_first_call_ms", "delete_ms", "bundle_build_s", "create_ms", "first_call_ms")


class SandboxLifecycleSmokeTest(unittest.TestCase):
    def test_quick_run_reports_every_key(self):
        # The py_binary's launcher, from this test's runfiles (it is a data dep).
        binary = os.path.join(BENCH_DIR, "sandbox_lifecycle")
        report = run_report(self, [sys.executable, binary, "--quick"], timeout_s=800, echo=True)

        positive_numbers(self, report, HEADLINE, "report")
        self.assertIn("bundle_build_repeat_s", report)  # null with --quick
        self.assertIsInstance(report["target_met"], bool)
        self.assertEqual(report["target_met"], report["create_to_first_call_ms"] < 300)
        self.assertAlmostEqual(report["create_ms"] + report["first_call_ms"],
                               report["create_to_first_call_ms"],
                               delta=0.5 * report["create_to_first_call_ms"])
        details = report["details"]
        self.assertEqual(details["runs"], 3)
        self.assertEqual(details["image"], "busybox")
        self.assertEqual(len(details["loadavg_start"]), 3)
        self.assertGreater(details["machine"]["cpus"], 0)
        for key in ("create_to_first_call_ms", "create_ms", "first_call_ms", "delete_ms"):
            self.assertGreaterEqual(details["p90"][key], report[key], key)
        main = details["main"]
        self.assertEqual(len(main["samples"]["create_to_first_call_ms"]), 3)
        # The daemon log gave the worker's timestamps (--log-level debug by default).
        self.assertGreater(main["stats"]["call.worker_boot_ms"]["median"], 0)
        self.assertIsNotNone(details["bundle"]["fresh"]["sha256"])
        # The machine's floor, timed beside each measured run, and ours over it.
        positive_numbers(self, report["floor"], ("bwrap_true_ms", "bwrap_python_ms"), "floor")
        self.assertEqual(len(main["samples"]["floor.bwrap_python_ms"]), 3)
        ratios = report["ratios"]
        positive_numbers(self, ratios, ("create_to_first_call_over_bwrap_true",
                                        "create_to_first_call_over_bwrap_python"), "ratios")
        # A cold create runs a bwrap itself and more: never under the bare one.
        self.assertGreater(ratios["create_to_first_call_over_bwrap_true"], 1)
        self.assertEqual(report["targets_met"]["create_to_first_call_at_most_80ms"],
                         report["create_to_first_call_ms"] <= 80)
        self.assertNotIn("error", report)


if __name__ == "__main__":
    unittest.main()
