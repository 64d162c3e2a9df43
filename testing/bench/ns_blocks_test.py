"""ns_blocks.py: its ratios when a block has no preemption, and its sched: field."""

import os
import subprocess
import sys
import unittest

import ns_blocks


class NsBlocksTest(unittest.TestCase):
    def test_median_ratio_leaves_out_pairs_whose_old_is_zero(self):
        self.assertEqual(ns_blocks.median_ratio([(2.0, 1.0), (0.0, 0.5), (1.0, 1.5), (4.0, 4.0)]), 1.0)

    def test_median_ratio_is_none_when_every_old_is_zero(self):
        self.assertIsNone(ns_blocks.median_ratio([(0.0, 0.3), (0.0, 0.0)]))

    def test_sched_field_is_read_from_the_extras(self):
        self.assertEqual(ns_blocks._sched("d,w,v,--calls_cpu=off,sched:batch"), "batch")
        self.assertEqual(ns_blocks._sched("d,w,v,A=1"), "")

    def test_a_bad_sched_value_exits_2_before_any_stack_starts(self):
        script = os.path.join(os.path.dirname(os.path.abspath(ns_blocks.__file__)), "ns_blocks.py")
        got = subprocess.run([sys.executable, script, "--stack", "/nonexistent/d,w,v",
                              "--stack", "/nonexistent/d,w,v,sched:fifo"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(got.returncode, 2)
        self.assertIn("sched:fifo: give sched:batch or sched:other", got.stderr)


if __name__ == "__main__":
    unittest.main()
