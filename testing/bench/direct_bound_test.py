"""direct_bound's summary on made-up rounds, and worker_direct against the
real agentix-worker (a few calls: its JSON line and its checks of the reply;
no timing thresholds)."""

import json
import os
import subprocess
import unittest

import direct_bound
import procs


def side(p50, p99, cpu):
    return {"p50_us": p50, "p99_us": p99, "cpu_us": cpu}


class SummariseTest(unittest.TestCase):
    def test_ratios_are_medians_of_per_round_ratios(self):
        rounds = [
            {"load": 1.0, "direct": side(40, 80, 50), "relayed": side(80, 200, 100),
             "floor_plain": side(30, 60, 40), "floor_relay": side(60, 90, 80)},
            {"load": 2.0, "direct": side(50, 100, 60), "relayed": side(75, 150, 90),
             "floor_plain": side(30, 60, 40), "floor_relay": side(90, 120, 100)},
            {"load": 3.0, "direct": side(40, 80, 40), "relayed": side(100, 160, 100),
             "floor_plain": side(40, 60, 40), "floor_relay": side(80, 90, 120)},
        ]
        got = direct_bound.summarise(rounds)
        self.assertEqual(got["medians"]["direct"]["p50_us"], 40)
        self.assertEqual(got["medians"]["relayed"]["cpu_us"], 100)
        # per round 2.0, 1.5, 2.5: the median of the ratios, not of the sides.
        self.assertEqual(got["ratios"]["p50 relayed / direct"]["median"], 2.0)
        self.assertEqual(got["ratios"]["CPU relayed / direct"]["rounds"], [2.0, 1.5, 2.5])
        self.assertEqual(got["ratios"]["p50 relay floor / plain floor"]["median"], 2.0)
        # No relayed_default side in these rounds: no such ratio.
        self.assertNotIn("p50 relayed_default / direct", got["ratios"])


class WorkerDirectTest(unittest.TestCase):
    def test_noops_against_the_real_worker(self):
        tool = procs.runfile("testing/bench/worker_direct")
        worker = procs.runfile("worker/agentix-worker")
        self.assertIsNotNone(tool)
        self.assertIsNotNone(worker)
        out = subprocess.run([str(tool), f"--worker={worker}",
                              f"--python-path={direct_bound.BENCH_DIR}", "--calls=50"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        row = json.loads(out.stdout)
        self.assertEqual(row["calls"], 50)
        self.assertEqual(row["warmup"], 10)
        self.assertGreater(row["p50_us"], 0)
        self.assertLessEqual(row["p50_us"], row["p99_us"])
        self.assertGreater(row["worker_cpu_us_per_call"], 0)
        self.assertFalse(row["payload_area"])

    def test_a_payload_area_and_the_callers_own_work(self):
        tool = procs.runfile("testing/bench/worker_direct")
        worker = procs.runfile("worker/agentix-worker")
        out = subprocess.run([str(tool), f"--worker={worker}",
                              f"--python-path={direct_bound.BENCH_DIR}", "--calls=30",
                              "--payload-area", "--client-work-us=200"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        row = json.loads(out.stdout)
        self.assertTrue(row["payload_area"])
        self.assertEqual(row["client_work_us"], 200)
        # The spin is CPU the caller burns per call, whatever the load.
        self.assertGreaterEqual(row["client_cpu_us_per_call"], 200)

    def test_a_callable_that_is_not_a_noop_is_reported(self):
        # A python path without bench_targets: the worker answers an error
        # frame (ModuleNotFoundError), which the tool must not count as a call.
        tool = procs.runfile("testing/bench/worker_direct")
        worker = procs.runfile("worker/agentix-worker")
        empty = os.environ.get("TEST_TMPDIR", "/tmp")
        out = subprocess.run([str(tool), f"--worker={worker}", f"--python-path={empty}",
                              "--calls=5"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 1)
        self.assertIn("expected result, got error", out.stderr)
        self.assertIn("ModuleNotFoundError", out.stderr)


if __name__ == "__main__":
    unittest.main()
