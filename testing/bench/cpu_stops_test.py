"""cpu_stops: gaps are found where a scripted clock jumps, the figures read
them right, and a run prints one JSON line per machine. No thresholds on the
real clock's stops: they are the machine's, whatever it is doing."""

import json
import os
import subprocess
import sys
import unittest

import cpu_stops


def scripted_clock(steps_ns):
    """A clock starting at 0 that advances by each of `steps_ns` in turn, then by
    100 ns a read for ever."""
    state = {"now": 0, "steps": iter(steps_ns)}

    def clock():
        value = state["now"]
        state["now"] += next(state["steps"], 100)
        return value

    return clock


class GapsTest(unittest.TestCase):
    def test_only_jumps_over_the_threshold_are_stops(self):
        clock = scripted_clock([100, 100, 20_000, 100, 4_000, 100, 45_000, 100])
        found = cpu_stops.gaps(0.001, clock=clock)
        self.assertEqual(found, [20_000, 45_000])

    def test_the_loop_ends_after_the_asked_time(self):
        clock = scripted_clock([])
        self.assertEqual(cpu_stops.gaps(0.0005, clock=clock), [])
        # 0.5 ms at 100 ns a read: ~5,000 reads, not an endless loop.


class SummarizeTest(unittest.TestCase):
    def test_figures_per_second_and_share_lost(self):
        stops = [10_000] * 20 + [40_000] * 5  # over 0.5 s
        got = cpu_stops.summarize(1, stops, 0.5)
        self.assertEqual(got["cpu"], 1)
        self.assertEqual(got["stops_per_s"], 50)
        self.assertEqual(got["over_30us_per_s"], 10)
        self.assertAlmostEqual(got["lost_pct"], (200_000 + 200_000) / 0.5e9 * 100, places=2)
        self.assertEqual(got["mean_us"], 16.0)
        self.assertEqual(got["max_us"], 40.0)

    def test_a_cpu_with_no_stop(self):
        got = cpu_stops.summarize(0, [], 0.25)
        self.assertEqual((got["stops_per_s"], got["lost_pct"], got["mean_us"], got["max_us"]),
                         (0, 0.0, 0.0, 0.0))

    def test_describe_names_every_cpu(self):
        report = {"cpus": [cpu_stops.summarize(0, [20_000] * 3, 1.0),
                           cpu_stops.summarize(1, [50_000], 1.0)]}
        line = cpu_stops.describe(report)
        self.assertIn("cpu0", line)
        self.assertIn("cpu1", line)
        self.assertIn("1/s of 30 us or more", line)
        self.assertEqual(cpu_stops.describe(None), "not measured")


class LocalTimerTest(unittest.TestCase):
    INTERRUPTS = (
        "            CPU0       CPU1       \n"
        "  24:          1          0  ACPI:Ged\n"
        "LOC:     569919     553243   Local timer interrupts\n"
        "SPU:          0          0   Spurious interrupts\n")

    def test_the_loc_line_gives_one_count_per_cpu(self):
        self.assertEqual(cpu_stops.local_timer_counts(self.INTERRUPTS), {0: 569919, 1: 553243})

    def test_columns_are_the_cpus_the_header_names(self):
        # CPU1 offline: the second column is CPU2's.
        text = ("            CPU0       CPU2\n"
                "LOC:        10         20   Local timer interrupts\n")
        self.assertEqual(cpu_stops.local_timer_counts(text), {0: 10, 2: 20})

    def test_no_loc_line_is_not_known(self):
        self.assertIsNone(cpu_stops.local_timer_counts("      CPU0\n  24:   1  ACPI\n"))
        self.assertIsNone(cpu_stops.local_timer_counts(""))

    def test_the_rate_is_per_second(self):
        got = cpu_stops.summarize(0, [], 0.25, timer_interrupts=63)
        self.assertEqual(got["timer_interrupts_per_s"], 252)
        self.assertIsNone(cpu_stops.summarize(0, [], 0.25)["timer_interrupts_per_s"])


class RunTest(unittest.TestCase):
    def test_a_run_prints_one_json_line_and_keeps_the_mask(self):
        before = os.sched_getaffinity(0)
        script = os.path.join(os.path.dirname(os.path.abspath(cpu_stops.__file__)), "cpu_stops.py")
        out = subprocess.run([sys.executable, script, "--seconds", "0.02", "--max-cpus", "2"],
                             stdout=subprocess.PIPE, text=True, check=True, timeout=60).stdout
        lines = [l for l in out.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1)
        report = json.loads(lines[0])
        self.assertEqual(len(report["cpus"]), min(2, len(before)))
        for cpu in report["cpus"]:
            self.assertIn(cpu["cpu"], before)
            self.assertGreaterEqual(cpu["lost_pct"], 0.0)
            self.assertLessEqual(cpu["lost_pct"], 100.0)
            if cpu_stops.local_timer_counts() is not None:  # x86 Linux: a count, not None
                self.assertGreaterEqual(cpu["timer_interrupts_per_s"], 0)
        # In this process too: measure() gives the thread its mask back.
        cpu_stops.measure(0.005, 1)
        self.assertEqual(os.sched_getaffinity(0), before)

    def test_bad_arguments_are_refused(self):
        script = os.path.join(os.path.dirname(os.path.abspath(cpu_stops.__file__)), "cpu_stops.py")
        proc = subprocess.run([sys.executable, script, "--seconds", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--seconds must be positive", proc.stderr)


if __name__ == "__main__":
    unittest.main()
