"""How a same-run A/B's rounds combine into medians and ratios (procs.ab_summary),
and what every report says of the machine's idle policy (procs.idle_policy)."""

import os
import tempfile
import unittest

import procs


class AbSummaryTest(unittest.TestCase):
    def test_medians_of_each_side_and_of_the_per_round_ratios(self):
        rows = [{"a": {"p50": 100.0}, "b": {"p50": 90.0}},
                {"a": {"p50": 200.0}, "b": {"p50": 100.0}},
                {"a": {"p50": 120.0}, "b": {"p50": 132.0}}]
        self.assertEqual(procs.ab_summary(rows)["p50"],
                         {"a_median": 120.0, "b_median": 100.0, "median_ratio_b_over_a": 0.9})

    def test_a_figure_missing_from_any_round_or_side_is_left_out(self):
        # c64_ab's per-thread figures: a thread under its threshold in one
        # round, or a thread only one side's binary has.
        rows = [{"a": {"p50": 1.0, "c64_core:daemon:x": 0.5}, "b": {"p50": 1.0, "c64_core:daemon:x": 0.4}},
                {"a": {"p50": 1.0, "c64_core:daemon:x": 0.5}, "b": {"p50": 1.0}},
                {"a": {"p50": 1.0}, "b": {"p50": 1.0, "c64_core:worker:y": 0.2}}]
        self.assertEqual(list(procs.ab_summary(rows)), ["p50"])

    def test_a_zero_on_side_a_has_no_ratio(self):
        rows = [{"a": {"preempted": 0.0}, "b": {"preempted": 1.0}}]
        self.assertIsNone(procs.ab_summary(rows)["preempted"]["median_ratio_b_over_a"])



class IdlePolicyTest(unittest.TestCase):
    """Every report's machine says how its idle CPUs wait (procs.idle_policy)."""

    def _sysfs(self, root, governor=None, poll_ns=None):
        if governor is not None:
            os.makedirs(os.path.join(root, "devices/system/cpu/cpuidle"))
            with open(os.path.join(root, "devices/system/cpu/cpuidle/current_governor_ro"), "w") as f:
                f.write(governor + "\n")
        if poll_ns is not None:
            os.makedirs(os.path.join(root, "module/haltpoll/parameters"))
            with open(os.path.join(root, "module/haltpoll/parameters/guest_halt_poll_ns"), "w") as f:
                f.write(poll_ns + "\n")
        return root

    def test_haltpoll_reports_its_window_and_other_governors_none(self):
        with tempfile.TemporaryDirectory() as tmp:
            halting = self._sysfs(os.path.join(tmp, "a"), "haltpoll", "0")
            polling = self._sysfs(os.path.join(tmp, "b"), "haltpoll", "200000")
            menu = self._sysfs(os.path.join(tmp, "c"), "menu", "200000")
            bare = os.path.join(tmp, "d")
            self.assertEqual(procs.idle_policy(halting), {"cpuidle_governor": "haltpoll", "guest_halt_poll_ns": 0})
            self.assertEqual(procs.idle_policy(polling)["guest_halt_poll_ns"], 200000)
            self.assertEqual(procs.idle_policy(menu), {"cpuidle_governor": "menu", "guest_halt_poll_ns": None})
            self.assertEqual(procs.idle_policy(bare), {"cpuidle_governor": None, "guest_halt_poll_ns": None})
        self.assertIn("idle", procs.machine())


if __name__ == "__main__":
    unittest.main()
