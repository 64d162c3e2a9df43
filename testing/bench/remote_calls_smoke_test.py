"""Smoke test: the benchmark runs (baseline half, --quick) and reports sane numbers.

Asserts only structure and positivity, never timing thresholds: it must pass on a
slow or busy machine. Our own stack is measured by `bazel run :remote_calls`.
"""

import json
import os
import subprocess
import sys
import unittest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
HEADLINE_KEYS = ("noop_p50_us", "noop_p99_us", "calls_per_s_c1", "calls_per_s_c16",
                 "calls_per_s_c64", "mb_per_s_1mib", "mb_per_s_16mib", "mb_per_s_64mib")


class RemoteCallsSmokeTest(unittest.TestCase):
    def test_quick_baseline_run_reports_every_key(self):
        proc = subprocess.run(
            [sys.executable, os.path.join(BENCH_DIR, "remote_calls.py"),
             "--quick", "--only", "baseline"],
            stdout=subprocess.PIPE, text=True, timeout=280)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        lines = [l for l in proc.stdout.splitlines() if l.strip()]
        report = json.loads(lines[-1])  # the JSON object is the LAST line

        for key in HEADLINE_KEYS + ("baseline", "ratios", "targets_met"):
            self.assertIn(key, report)
        baseline = report["baseline"]
        for key in HEADLINE_KEYS:
            value = baseline[key]
            self.assertIsInstance(value, (int, float), key)
            self.assertGreater(value, 0, key)
        self.assertLessEqual(baseline["noop_p50_us"], baseline["noop_p99_us"])
        self.assertEqual(report["details"]["baseline"]["worker_glibc_tunables"],
                         report["details"]["glibc_tunables"])


if __name__ == "__main__":
    unittest.main()
