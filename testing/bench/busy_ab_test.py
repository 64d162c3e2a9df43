"""busy_ab.py: its summary, its NAME=VALUE settings, and what it reads from /proc."""

import os
import subprocess
import sys
import time
import unittest

import busy_ab


class BusyAbTest(unittest.TestCase):
    def test_summary_is_medians_and_the_median_of_per_run_ratios(self):
        runs = [{"old": {"p50_us": 100.0, "on_spinner_cpu": None}, "new": {"p50_us": 90.0, "on_spinner_cpu": None}},
                {"old": {"p50_us": 120.0}, "new": {"p50_us": 120.0}},
                {"old": {"p50_us": 80.0}, "new": {"p50_us": 100.0}}]
        got = busy_ab.summarize(runs)
        self.assertEqual(got["p50_us"]["old"], 100.0)
        self.assertEqual(got["p50_us"]["new"], 100.0)
        self.assertEqual(got["p50_us"]["ratio"], 1.0)
        self.assertEqual(got["p50_us"]["per_run"], [0.9, 1.0, 1.25])
        self.assertNotIn("on_spinner_cpu", got)  # no figure on either side: left out

    def test_a_zero_old_figure_has_no_ratio(self):
        got = busy_ab.summarize([{"old": {"inv_host": 0.0}, "new": {"inv_host": 0.3}}])
        self.assertIsNone(got["inv_host"]["ratio"])
        self.assertEqual(got["inv_host"]["new"], 0.3)

    def test_a_setting_without_a_name_or_value_exits_2(self):
        script = os.path.join(os.path.dirname(os.path.abspath(busy_ab.__file__)), "busy_ab.py")
        got = subprocess.run([sys.executable, script, "--a-sandboxd", "x", "--a-worker", "x",
                              "--a-python", "x", "--b-env", "AGENTIX_CALLS_CPU"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(got.returncode, 2)
        self.assertIn("is not NAME=VALUE", got.stderr)

    def test_switches_count_a_threads_sleeps(self):
        before = busy_ab.switches(os.getpid())
        for _ in range(20):
            time.sleep(0.001)
        after = busy_ab.switches(os.getpid())
        self.assertGreaterEqual(after[1] - before[1], 20)

    def test_a_stack_pinned_with_the_spinner_is_all_on_its_cpu(self):
        cpu = min(os.sched_getaffinity(0))
        child = subprocess.Popen([sys.executable, "-c",
                                  f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\n"
                                  "print('pinned', flush=True)\n"
                                  "end = time.monotonic() + 60\nwhile time.monotonic() < end: pass"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            # Sampled from its pin on, until the sampler has seen 0.1 s of its CPU:
            # a fixed 0.2 s window saw nothing once on a loaded CI machine (the
            # child still starting, or the sampler thread not yet run).
            self.assertEqual(child.stdout.readline().strip(), "pinned")
            with busy_ab.PlacementSampler([child.pid], child.pid) as sampler:
                deadline = time.monotonic() + 30
                while sampler.total_ns < 100_000_000 and time.monotonic() < deadline:
                    time.sleep(0.02)
        finally:
            child.kill()
            child.wait(timeout=30)
            child.stdout.close()
        self.assertEqual(sampler.share(), 1.0)

    def test_no_spinner_no_share(self):
        with busy_ab.PlacementSampler([os.getpid()], None) as sampler:
            time.sleep(0.01)
        self.assertIsNone(sampler.share())


if __name__ == "__main__":
    unittest.main()
