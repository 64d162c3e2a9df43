"""Smoke test: the side-channel benchmark runs both stacks (--quick) and reports sane numbers.

Asserts structure and positivity only, never timing thresholds or targets: it must pass
on a slow or busy machine. The figures come from `bazel run :side_channels`.
"""

import json
import os
import subprocess
import sys
import unittest

from smoke_checks import daemon_share, positive_numbers, run_report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
HEADLINE_KEYS = ("log_records_per_s", "spans_per_s", "ns_request_p50_us")
CPU_KEYS = ("ns_request_cpu_us_per_call", "log_cpu_us_per_record", "span_cpu_us_per_span")
RATIO_KEYS = ("ns_request_p50_ours_over_floor", "log_records_per_s_floor_over_ours",
              "spans_per_s_floor_over_ours", "ns_request_p50_ours_over_floor_grpc",
              "ns_request_p50_ours_over_floor_relay")


class SideChannelsSmokeTest(unittest.TestCase):
    def test_quick_run_of_both_stacks_reports_every_key(self):
        report = run_report(
            self, [sys.executable, os.path.join(BENCH_DIR, "side_channels.py"), "--quick",
                   "--daemon-arg=--log_level=warning"],
            timeout_s=280)
        self.assertEqual(report["details"]["daemon_args"], ["--log_level=warning"])

        for key in HEADLINE_KEYS + ("baseline", "ratios", "targets_met", "details"):
            self.assertIn(key, report)
        positive_numbers(self, report, HEADLINE_KEYS, "ours")
        positive_numbers(self, report["baseline"], HEADLINE_KEYS, "baseline")
        positive_numbers(self, report["ratios"], tuple(report["ratios"]), "ratios")
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

        # Issue 25: the floor (same run), ours with one busy core, CPU per item.
        positive_numbers(self, report, CPU_KEYS, "ours")
        positive_numbers(self, details["baseline"]["ns_request_cpu_us"],
                         ("host", "server", "worker", "total"), "baseline ns cpu")
        # A direct Namespace stream (the default) never wakes the daemon.
        positive_numbers(self, details["ours"]["ns_request_cpu_us"], ("host", "worker", "total"),
                         "ours ns cpu")
        daemon_share(self, details["ours"]["ns_request_cpu_us"]["server"], "ours ns cpu.server")
        self.assertGreater(details["ours"]["logs"]["stream"]["bytes_per_item"], 0)
        positive_numbers(self, report["floor"], HEADLINE_KEYS + CPU_KEYS, "floor")
        positive_numbers(self, report["floor_grpc"],
                         ("ns_request_p50_us", "ns_request_cpu_us_per_call"), "floor_grpc")
        positive_numbers(self, report["floor_relay"],
                         ("ns_request_p50_us", "ns_request_cpu_us_per_call"), "floor_relay")
        floor_details = report["floor"]["details"]
        self.assertEqual(floor_details["logs"]["record_bytes"],
                         round(details["ours"]["logs"]["stream"]["bytes_per_item"]))
        self.assertEqual(floor_details["ping_pong"]["small_bytes"],
                         floor_details["ns_request_bytes"])
        busy = report["busy"]
        positive_numbers(self, busy, HEADLINE_KEYS + CPU_KEYS, "busy")
        positive_numbers(self, busy["floor"], HEADLINE_KEYS, "busy.floor")
        positive_numbers(self, busy["floor_grpc"], ("ns_request_p50_us",), "busy.floor_grpc")
        positive_numbers(self, busy["floor_relay"], ("ns_request_p50_us",), "busy.floor_relay")
        self.assertIs(busy["spinner"]["pinned"], False)
        self.assertEqual(busy["plan"], "quick")  # a --quick run's busy pass is quick too
        positive_numbers(self, report["ratios"], RATIO_KEYS, "ratios")
        positive_numbers(self, report["ratios"], tuple("busy_" + k for k in RATIO_KEYS), "ratios")

    def test_a_daemon_arg_reaches_the_daemon(self):
        # A flag the daemon refuses: it exits, so ours fails; the floors still run.
        proc = subprocess.run(
            [sys.executable, os.path.join(BENCH_DIR, "side_channels.py"), "--quick",
             "--only", "ours", "--no-busy", "--daemon-arg=--agx_bench_no_such_flag"],
            stdout=subprocess.PIPE, text=True, timeout=280)
        self.assertEqual(proc.returncode, 1, proc.stdout[-4000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(report["details"]["daemon_args"], ["--agx_bench_no_such_flag"])
        self.assertIn("ours: no result (exit code 1)", report["errors"])
        self.assertIsNone(report["ns_request_p50_us"])


if __name__ == "__main__":
    unittest.main()
