"""How a two-stack benchmark combines its rounds into one side's figures."""

import types
import unittest
from unittest import mock

import stack_rounds


class CombineTest(unittest.TestCase):
    def test_numbers_are_medians_at_every_depth(self):
        rounds = [
            {"p50": 30.0, "logs": {"cpu_us_per_item": {"host": 20.5, "worker": 32.5}, "n": 100}},
            {"p50": 10.0, "logs": {"cpu_us_per_item": {"host": 18.1, "worker": 27.3}, "n": 100}},
            {"p50": 20.0, "logs": {"cpu_us_per_item": {"host": 17.0, "worker": 27.0}, "n": 100}},
        ]
        combined = stack_rounds.combine(rounds)
        self.assertEqual(combined["p50"], 20.0)
        self.assertEqual(combined["logs"]["cpu_us_per_item"], {"host": 18.1, "worker": 27.3})
        self.assertEqual(combined["logs"]["n"], 100)

    def test_a_round_without_a_figure_is_left_out(self):
        combined = stack_rounds.combine([{"p50": None}, {"p50": 4.0}, {"p50": 6.0}])
        self.assertEqual(combined["p50"], 5.0)
        self.assertIsNone(stack_rounds.combine([{"p50": None}])["p50"])

    def test_flags_hold_only_if_every_round_held(self):
        combined = stack_rounds.combine([{"complete": True}, {"complete": False}, {"complete": True}])
        self.assertIs(combined["complete"], False)
        self.assertIs(stack_rounds.combine([{"ok": True}, {"ok": True}])["ok"], True)

    def test_text_and_lists_come_from_the_first_round(self):
        combined = stack_rounds.combine([{"mode": "full", "warnings": ["a"]},
                                         {"mode": "full", "warnings": []}])
        self.assertEqual(combined, {"mode": "full", "warnings": ["a"]})

    def test_no_rounds_is_none(self):
        self.assertIsNone(stack_rounds.combine([]))
        self.assertIsNone(stack_rounds.combine(None))


class RoundsTest(unittest.TestCase):
    def test_rounds_alternate_and_record_a_cpu_probe_before_each(self):
        ran = []

        def fake_child(script, side, args, env, timeout_s):
            ran.append(side)
            return {"p50": float(len(ran))}, None

        args = types.SimpleNamespace(only="all", rounds=2, quick=True, daemon_arg=["--direct_calls"])
        with mock.patch.object(stack_rounds, "run_child", fake_child), \
                mock.patch.object(stack_rounds, "cpu_probe_ms", side_effect=[1.0, 2.0, 3.0, 4.0]):
            rounds = stack_rounds.Rounds("script.py", args, {}, 1.0)
        self.assertEqual(ran, ["baseline", "ours", "ours", "baseline"])
        details = rounds.details(["p50"])
        self.assertEqual(details["cpu_probe_ms"], {"baseline": [1.0, 4.0], "ours": [2.0, 3.0]})
        self.assertEqual(details["per_round"], {"baseline": [{"p50": 1.0}, {"p50": 4.0}],
                                                "ours": [{"p50": 2.0}, {"p50": 3.0}]})
        self.assertEqual(details["daemon_args"], ["--direct_calls"])

    def test_beside_runs_right_before_each_round_of_its_side_and_pairs_with_it(self):
        events = []
        floors = iter([{"p50": 10.0}, {"p50": 12.0}, RuntimeError("floor failed"),
                       {"p50": 20.0}])

        def fake_child(script, side, args, env, timeout_s):
            events.append(side)
            if len([e for e in events if e == side]) == 2:
                return None, f"{side}: no result"  # the second round fails
            return {"p50": 30.0 * len(events)}, None

        def fake_floor():
            events.append("floor")
            value = next(floors)
            if isinstance(value, Exception):
                raise value
            return value

        args = types.SimpleNamespace(only="ours", rounds=4, quick=True, daemon_arg=[])
        with mock.patch.object(stack_rounds, "run_child", fake_child), \
                mock.patch.object(stack_rounds, "cpu_probe_ms", return_value=1.0):
            rounds = stack_rounds.Rounds("script.py", args, {}, 1.0,
                                         beside={"ours": fake_floor})
        self.assertEqual(events, ["floor", "ours"] * 4)
        # Round 2's child failed (dropped with its floor); round 3's floor failed
        # (the round stays, unpaired); rounds 1 and 4 pair.
        self.assertEqual([r["p50"] for r, _ in rounds.paired["ours"]], [60.0, 180.0, 240.0])
        self.assertEqual([b for _, b in rounds.paired["ours"]],
                         [{"p50": 10.0}, None, {"p50": 20.0}])
        self.assertEqual(rounds.paired_ratios("ours", "p50", "p50"), [6.0, 12.0])
        self.assertTrue(any("floor failed" in e for e in rounds.errors), rounds.errors)
        self.assertTrue(any("no result" in e for e in rounds.errors), rounds.errors)

    def test_a_child_gets_each_daemon_arg_in_the_equals_form(self):
        # "--daemon-arg --direct_calls" would be taken for the child's own option.
        class Started(Exception):
            pass

        seen = []

        def fake_start(argv, **kwargs):
            seen.extend(argv)
            raise Started

        args = types.SimpleNamespace(quick=False, sandboxd=None, worker=None,
                                     daemon_arg=["--direct_calls", "--calls_cpu=off"])
        with mock.patch.object(stack_rounds.procs, "start_process", fake_start), \
                self.assertRaises(Started):
            stack_rounds.run_child("script.py", "ours", args, {}, 1.0)
        self.assertEqual(seen[-2:], ["--daemon-arg=--direct_calls", "--daemon-arg=--calls_cpu=off"])

    def test_the_cpu_probe_is_a_median_of_positive_timings(self):
        with mock.patch.object(stack_rounds.time, "perf_counter",
                               side_effect=[0.0, 0.004, 1.0, 1.002, 2.0, 2.009]):
            self.assertEqual(stack_rounds.cpu_probe_ms(repeats=3), 4.0)


if __name__ == "__main__":
    unittest.main()
