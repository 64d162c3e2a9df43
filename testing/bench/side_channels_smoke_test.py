"""Smoke test: the side-channel benchmark runs both stacks (--quick) and reports sane numbers.

Asserts structure and positivity only, never timing thresholds or targets: it must pass
on a slow or busy machine. The figures come from `bazel run :side_channels`.
"""

import json
import os
import subprocess
import sys
import unittest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
HEADLINE_KEYS = ("log_records_per_s", "spans_per_s", "ns_request_p50_us")


class SideChannelsSmokeTest(unittest.TestCase):
    def test_quick_run_of_both_stacks_reports_every_key(self):
        proc = subprocess.run(
            [sys.executable, os.path.join(BENCH_DIR, "side_channels.py"), "--quick"],
            stdout=subprocess.PIPE, text=True, timeout=200)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        lines = [l for l in proc.stdout.splitlines() if l.strip()]
        report = json.loads(lines[-1])  # the JSON object is the LAST line

        for key in HEADLINE_KEYS + ("baseline", "ratios", "targets_met", "details"):
            self.assertIn(key, report)
        for side in (report, report["baseline"]):
            for key in HEADLINE_KEYS:
                self.assertIsInstance(side[key], (int, float), key)
                self.assertGreater(side[key], 0, key)
        for key, value in report["ratios"].items():
            self.assertIsInstance(value, (int, float), key)
            self.assertGreater(value, 0, key)
        for key, value in report["targets_met"].items():
            self.assertIsInstance(value, bool, key)
        details = report["details"]
        self.assertEqual(details["rounds"], 1)
        self.assertEqual(details["mode"], "quick")
        self.assertIn("start", details["loadavg_1m"])
        for side in ("ours", "baseline"):
            self.assertTrue(details[side]["logs"]["complete"], side)
            self.assertTrue(details[side]["spans"]["complete"], side)
        self.assertNotIn("errors", report)


if __name__ == "__main__":
    unittest.main()
