"""work_floor: the chunk is sized to the asked length, the figures read the
timings right, and a run prints one JSON line a benchmark can read. No timing
thresholds on the real clock: it must pass on a busy machine."""

import json
import os
import subprocess
import sys
import unittest

import floors
import work_floor


def linear_cost(ns_per_unit: float):
    """A fake `chunk_cpu_ns`: a chunk costs units x ns_per_unit; records calls."""
    calls = []

    def cost(units, count):
        calls.append((units, count))
        return units * ns_per_unit

    cost.calls = calls
    return cost


class CalibrateTest(unittest.TestCase):
    def test_the_chunk_is_sized_to_the_asked_cpu_time(self):
        cost = linear_cost(ns_per_unit=70.0)  # 50 µs = ~714 units
        units = work_floor.calibrate(50.0, cost=cost)
        self.assertAlmostEqual(units * 70.0 / 1e3, 50.0, delta=5.0)
        # Each try timed 101 chunks (a mean, not one sample).
        self.assertTrue(all(count == 101 for _, count in cost.calls))

    def test_a_clock_that_reads_zero_grows_the_chunk_instead_of_dividing_by_zero(self):
        readings = iter([0, 0] + [1000] * 10)  # two tries too short to see

        def cost(units, count):
            return next(readings) * units / 64

        self.assertGreater(work_floor.calibrate(20.0, cost=cost), 64)

    def test_it_gives_up_after_its_tries_with_the_last_estimate(self):
        sizes = []

        def jittery(units, count):  # each try reads 3x or 1/3x the truth
            sizes.append(units)
            factor = 3.0 if len(sizes) % 2 else 1 / 3
            return units * 100 * factor

        units = work_floor.calibrate(50.0, cost=jittery, tries=4)
        self.assertEqual(len(sizes), 4)
        self.assertGreaterEqual(units, 1)

    def test_the_cpu_cost_is_a_mean_per_chunk_on_the_given_clock(self):
        ticks = iter([1_000, 31_000])  # 30 µs for 3 chunks
        self.assertEqual(work_floor.chunk_cpu_ns(10, 3, clock=lambda: next(ticks)), 10_000)


class SummarizeTest(unittest.TestCase):
    def test_percentiles_ratio_and_the_share_over_twice_the_median(self):
        # 1,000 chunks: 970 of 10 µs, 20 of 25 µs, 10 of 40 µs.
        latencies = [10_000] * 970 + [25_000] * 20 + [40_000] * 10
        figures = work_floor.summarize(latencies[::-1])  # order does not matter
        self.assertEqual(figures["noop_p50_us"], 10.0)
        self.assertEqual(figures["noop_p90_us"], 10.0)
        self.assertEqual(figures["noop_p99_us"], 25.0)
        self.assertEqual(figures["p99_over_p50"], 2.5)
        self.assertEqual(figures["over_2x_p50_share"], 0.03)

    def test_no_chunks_is_an_error_not_a_figure(self):
        with self.assertRaises(ValueError):
            work_floor.summarize([])


class RunTest(unittest.TestCase):
    def run_script(self, *flags):
        script = os.path.join(os.path.dirname(os.path.abspath(work_floor.__file__)),
                              "work_floor.py")
        return subprocess.run([sys.executable, script, *flags], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)

    def test_a_quick_run_prints_the_noop_keys_sized_as_asked(self):
        proc = self.run_script("--chunk-us=20", "--quick")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(report["kind"], "python_work")
        self.assertEqual(report["chunks"], 3000)
        self.assertEqual(report["chunk_us_target"], 20.0)
        for key in ("noop_p50_us", "noop_p90_us", "noop_p99_us", "p99_over_p50"):
            self.assertGreater(report[key], 0, key)
        self.assertLessEqual(report["noop_p50_us"], report["noop_p99_us"])
        self.assertGreater(report["chunk_units"], 0)

    def test_bad_sizes_are_refused_with_the_flag_named(self):
        proc = self.run_script("--chunk-us=0")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--chunk-us", proc.stderr)
        proc = self.run_script("--chunks=5")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--chunks", proc.stderr)

    def test_floors_runs_it_in_this_interpreter(self):
        report = floors.run_work_floor(15, quick=True, log=lambda *_: None)
        self.assertEqual(report["python"], sys.executable)
        self.assertEqual(report["chunk_us_target"], 15.0)


if __name__ == "__main__":
    unittest.main()
