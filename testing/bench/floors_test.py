"""floors.process_cpu_s: a process's CPU over a phase never shrinks when a thread ends.
floors.busy_child_pass: which plan the busy pass runs ours with."""

import argparse
import subprocess
import sys
import time
import unittest

import floors
import stack_rounds

# Spins 0.3 s on a second thread that then ends, and sleeps until its stdin closes.
_CHILD = r"""
import sys, threading, time
def spin():
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
thread = threading.Thread(target=spin)
thread.start()
print("spinning", flush=True)
thread.join()
print("joined", flush=True)
sys.stdin.read()
"""


class ProcessCpuTest(unittest.TestCase):
    def test_a_thread_that_ends_keeps_its_time_in_the_process(self):
        child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "spinning")
            time.sleep(0.05)
            before = floors.process_cpu_s(child.pid)
            self.assertEqual(child.stdout.readline().strip(), "joined")
            after = floors.process_cpu_s(child.pid)
            # The spinner ran until it had spent ~0.3 s of wall time, most of it
            # after `before`; ending did not take its time away.
            self.assertGreater(after, before)
            self.assertGreater(after - before, 0.05)
        finally:
            child.stdin.close()
            child.wait(timeout=10)
        self.assertIsNone(floors.process_cpu_s(child.pid))


class _Rounds:
    """stack_rounds' run_child, recording the plan each child was asked for;
    its children's noop p50s are `p50s` in turn (None: that child failed)."""

    def __init__(self, p50s=(1.0,)):
        self.quick = []
        self.p50s = list(p50s)

    def run_child(self, script, side, args, env, timeout_s):
        self.quick.append(args.quick)
        p50 = self.p50s[(len(self.quick) - 1) % len(self.p50s)]
        if p50 is None:
            return None, f"{side}: no result (exit code 1)"
        return {"noop_p50_us": p50}, None

    combine = staticmethod(stack_rounds.combine)


class BusyPassPlanTest(unittest.TestCase):
    def _pass(self, run_quick, **kwargs):
        rounds = _Rounds()
        busy, errors = floors.busy_child_pass(rounds, "bench.py", argparse.Namespace(quick=run_quick),
                                              {}, 10.0, {}, ("noop_p50_us",), **kwargs)
        self.assertEqual(errors, [])
        self.assertEqual(busy["noop_p50_us"], 1.0)
        return rounds.quick, busy["plan"]

    def test_the_quick_plan_by_default_and_the_runs_own_when_asked(self):
        self.assertEqual(self._pass(False), ([True], "quick"))
        self.assertEqual(self._pass(False, quick=False), ([False], "full"))
        self.assertEqual(self._pass(True, quick=False), ([True], "quick"))  # a --quick run


class BusyPassRoundsTest(unittest.TestCase):
    def _pass(self, p50s, rounds):
        fake = _Rounds(p50s)
        return floors.busy_child_pass(fake, "bench.py", argparse.Namespace(quick=True), {}, 10.0,
                                      {}, ("noop_p50_us",), rounds=rounds)

    def test_the_busy_figures_are_medians_over_its_rounds_as_the_idle_ones(self):
        busy, errors = self._pass((30.0, 90.0, 40.0), rounds=3)
        self.assertEqual(errors, [])
        self.assertEqual(busy["noop_p50_us"], 40.0)
        self.assertEqual(busy["rounds"], 3)
        self.assertEqual([r["noop_p50_us"] for r in busy["per_round"]], [30.0, 90.0, 40.0])

    def test_a_failed_round_is_an_error_and_left_out_of_the_medians(self):
        busy, errors = self._pass((30.0, None, 50.0), rounds=3)
        self.assertEqual(errors, ["busy ours: no result (exit code 1)"])
        self.assertEqual(busy["noop_p50_us"], 40.0)
        self.assertEqual(busy["rounds"], 2)

    def test_no_round_and_no_floor_is_no_record(self):
        busy, errors = self._pass((None,), rounds=2)
        self.assertIsNone(busy)
        self.assertEqual(len(errors), 2)


if __name__ == "__main__":
    unittest.main()
