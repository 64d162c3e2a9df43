"""floors.process_cpu_s: a process's CPU over a phase never shrinks when a thread ends."""

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


if __name__ == "__main__":
    unittest.main()
