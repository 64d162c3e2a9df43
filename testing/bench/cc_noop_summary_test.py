"""remote_calls.py's `cc_noop` block: the C++ client's noop against the floors,
ratios taken within a round and then the median over the rounds."""

import unittest

import remote_calls


def _round(cc_p50, floor_p50, grpc_p50, raw_p50=None, block=None, relay_p50=None):
    cc = {"noop_p50_us": cc_p50, "raw_daemon_noop_p50_us": raw_p50,
          "noop_over_raw_daemon_block_median": block,
          "noop_cpu_us_per_call": 50.0, "raw_daemon_noop_cpu_us_per_call": 45.0}
    return {"cc_client": cc if cc_p50 else None,
            "floor": {"noop_p50_us": floor_p50} if floor_p50 else None,
            "floor_grpc": {"noop_p50_us": grpc_p50} if grpc_p50 else None,
            "floor_relay": {"noop_p50_us": relay_p50} if relay_p50 else None}


class CcNoopSummaryTest(unittest.TestCase):
    def test_ratios_are_per_round_then_the_median(self):
        # Round by round 200/20 = 10, 100/25 = 4, 300/30 = 10: the median is 10,
        # where the ratio of the medians (200 / 25) would be 8.
        summary = remote_calls.cc_noop_summary([
            _round(200.0, 10.0, 20.0, 180.0, 1.1, relay_p50=40.0),
            _round(100.0, 5.0, 25.0, 95.0, 1.05, relay_p50=50.0),
            _round(300.0, 6.0, 30.0, 250.0, 1.2, relay_p50=100.0),
        ])
        self.assertEqual(summary["p50_us"], 200.0)
        self.assertEqual(summary["floor_grpc_p50_us"], 25.0)
        self.assertEqual(summary["over_floor_grpc"], 10.0)
        self.assertEqual(summary["over_floor"], 20.0)
        # 200/40 = 5, 100/50 = 2, 300/100 = 3: the median is 3.
        self.assertEqual(summary["over_floor_relay"], 3.0)
        self.assertEqual(summary["floor_relay_p50_us"], 50.0)
        self.assertEqual(summary["raw_daemon_p50_us"], 180.0)
        self.assertEqual(summary["over_raw_daemon"], 1.1)
        self.assertEqual(summary["cpu_us_per_call"], 50.0)
        self.assertEqual(summary["raw_daemon_cpu_us_per_call"], 45.0)
        self.assertIs(summary["at_most_1_5x_floor_grpc"], False)

    def test_target_met_and_failed_programs_left_out(self):
        summary = remote_calls.cc_noop_summary([
            _round(30.0, 10.0, 25.0),
            _round(32.0, None, None),  # the floors failed this round
        ])
        self.assertEqual(summary["over_floor_grpc"], 1.2)
        self.assertEqual(summary["over_floor"], 3.0)
        self.assertIsNone(summary["over_floor_relay"])  # no relayed floor measured
        self.assertIsNone(summary["over_raw_daemon"])
        self.assertIs(summary["at_most_1_5x_floor_grpc"], True)

    def test_frame_wire_client_against_its_grpc_wire_self(self):
        rounds = [_round(100.0, 10.0, 50.0), _round(90.0, 10.0, 45.0), _round(120.0, 10.0, 40.0)]
        for r, grpc_wire in zip(rounds, (150.0, 180.0, 160.0)):
            r["cc_client"].update({"calls_wire": "frames", "grpc_wire_noop_p50_us": grpc_wire,
                                   "noop_over_grpc_wire_block_median": 100.0 / grpc_wire})
        summary = remote_calls.cc_noop_summary(rounds)
        self.assertEqual(summary["calls_wire"], "frames")
        self.assertEqual(summary["grpc_wire_p50_us"], 160.0)
        self.assertEqual(summary["over_grpc_wire"], round(100.0 / 160.0, 2))
        # 150/50 = 3, 180/45 = 4, 160/40 = 4: the median is 4.
        self.assertEqual(summary["grpc_wire_over_floor_grpc"], 4.0)
        # 100/50 = 2, 90/45 = 2, 120/40 = 3.
        self.assertEqual(summary["over_floor_grpc"], 2.0)

    def test_no_client_round_is_none(self):
        self.assertIsNone(remote_calls.cc_noop_summary([_round(None, 10.0, 20.0)]))


if __name__ == "__main__":
    unittest.main()
