"""Smoke test: the provider benchmark runs (--quick) and reports sane numbers.

Starts its own agentix-providerd, a few cold and warm sandboxes, N=10 idle
sandboxes, and the in-process baseline, and checks the LAST stdout line: every
headline key a positive number, the baseline's keys present. No timing
thresholds: it must pass on a slow or busy machine.
"""

import os
import sys
import unittest

from smoke_checks import positive_numbers, run_report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
HEADLINE = ("warm_acquire_p50_ms", "warm_acquire_p99_ms", "warm_acquire_c16_p50_ms",
            "cold_create_to_first_call_p50_ms", "delete_p50_ms", "watch_event_p50_ms",
            "idle_sandboxes_per_gib")


class ProviderBenchSmokeTest(unittest.TestCase):
    def test_quick_run_reports_every_key(self):
        binary = os.path.join(BENCH_DIR, "provider")  # the py_binary's launcher (a data dep)
        report = run_report(self, [sys.executable, binary, "--quick"], timeout_s=800, echo=True)
        self.assertNotIn("error", report)
        positive_numbers(self, report, HEADLINE, "report")
        # Kubernetes warm claims: the PATCH and nothing else on the claim path.
        self.assertGreater(report["k8s_claim_p50_ms"], 0)
        self.assertGreaterEqual(report["k8s_api_writes_per_warm_claim"], 1)
        self.assertLessEqual(report["k8s_api_writes_per_warm_claim"], 2)
        self.assertLessEqual(report["warm_acquire_p50_ms"], report["warm_acquire_p99_ms"])
        baseline = report["baseline"]
        for key in HEADLINE:
            self.assertIn(key, baseline)
        for key in ("cold_create_to_first_call_p50_ms", "delete_p50_ms", "idle_sandboxes_per_gib"):
            self.assertGreater(baseline[key], 0, key)
        details = report["details"]
        self.assertTrue(details["quick"])
        self.assertEqual(len(details["loadavg_start"]), 3)
        self.assertEqual(details["ours"]["density_n"], 10)
        self.assertEqual(details["ours"]["warm_misses"], 0)  # every measured claim was a pool hit
        self.assertEqual(details["ours"]["leftovers"], 0)  # no cgroup or process of a sandbox left
        self.assertGreater(details["ours"]["sandboxes_made"], 0)

        # Issue 25: the floors of this run, ours with one busy core, CPU per call.
        cpu_keys = ("warm_acquire_cpu_ms_per_call", "cold_create_to_first_call_cpu_ms_per_call")
        positive_numbers(self, report, cpu_keys, "ours")
        positive_numbers(self, details["ours"]["warm_cpu_ms_per_call"],
                         ("host", "providerd", "total"), "warm cpu")
        positive_numbers(self, details["ours"]["cold_cpu_ms_per_call"],
                         ("host", "providerd", "sandbox", "total"), "cold cpu")
        floor_keys = ("warm_acquire_p50_ms", "warm_acquire_p99_ms", "warm_acquire_cpu_ms_per_call")
        positive_numbers(self, report["floor"], floor_keys + ("cold_create_to_first_call_p50_ms",
                                                              "cold_create_to_first_call_cpu_ms_per_call"),
                         "floor")
        positive_numbers(self, report["floor_grpc"], floor_keys, "floor_grpc")
        self.assertEqual(report["floor"]["details"]["ping_pong"]["small_bytes"],
                         details["ours"]["create_response_bytes"])
        busy = report["busy"]
        positive_numbers(self, busy, ("warm_acquire_p50_ms", "warm_acquire_c16_p50_ms",
                                      "cold_create_to_first_call_p50_ms", "delete_p50_ms") + cpu_keys,
                         "busy")
        positive_numbers(self, busy["floor"], floor_keys, "busy.floor")
        positive_numbers(self, busy["floor_grpc"], floor_keys, "busy.floor_grpc")
        self.assertIs(busy["spinner"]["pinned"], False)
        self.assertEqual(busy["details"]["leftovers"], 0)
        ratios = [f"{p}{stem}_ours_over_{floor}" for p in ("", "busy_")
                  for floor in ("floor", "floor_grpc") for stem in ("warm_acquire_p50", "warm_acquire_p99")]
        ratios += ["cold_create_to_first_call_p50_ours_over_floor",
                   "busy_cold_create_to_first_call_p50_ours_over_floor"]
        positive_numbers(self, report["ratios"], ratios, "ratios")


if __name__ == "__main__":
    unittest.main()
