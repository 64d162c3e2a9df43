"""floors.process_cpu_s: a process's CPU over a phase never shrinks when a thread ends.
floors.busy_child_pass: which plan the busy pass runs ours with."""

import argparse
import subprocess
import sys
import time
import unittest

import floors

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
    """stack_rounds' run_child, recording the plan each child was asked for."""

    def __init__(self):
        self.quick = []

    def run_child(self, script, side, args, env, timeout_s):
        self.quick.append(args.quick)
        return {"noop_p50_us": 1.0}, None


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


if __name__ == "__main__":
    unittest.main()
