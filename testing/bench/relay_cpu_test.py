"""relay_cpu's per-call figures from two readings of a process's threads."""

import unittest

import relay_cpu


def reading(cpu_ns, user, system, voluntary, involuntary):
    return {"cpu_ns": cpu_ns, "user_ticks": user, "sys_ticks": system,
            "voluntary": voluntary, "involuntary": involuntary}


class PerCallTest(unittest.TestCase):
    def test_threads_of_a_name_sum_and_divide_by_the_calls(self):
        before = {"agx-frames/1": reading(1_000_000, 1, 1, 10, 5),
                  "agx-frames/2": reading(0, 0, 0, 0, 0),
                  "agx-wrk-read/3": reading(5_000, 0, 0, 3, 0)}
        after = {"agx-frames/1": reading(3_000_000, 2, 4, 110, 25),
                 "agx-frames/2": reading(1_000_000, 1, 0, 100, 15),
                 "agx-wrk-read/3": reading(2_005_000, 1, 1, 103, 60)}
        got = relay_cpu.per_call(before, after, calls=100)
        self.assertAlmostEqual(got["agx-frames"]["cpu_us"], 30.0)
        self.assertAlmostEqual(got["agx-frames"]["voluntary"], 2.0)
        self.assertAlmostEqual(got["agx-frames"]["involuntary"], 0.35)
        self.assertAlmostEqual(got["agx-frames"]["user_share"], 0.4)  # 2 of 5 ticks
        self.assertAlmostEqual(got["agx-wrk-read"]["cpu_us"], 20.0)
        self.assertAlmostEqual(got["total"]["cpu_us"], 50.0)

    def test_idle_and_new_threads_are_left_out(self):
        before = {"idle/1": reading(7, 0, 0, 1, 0)}
        after = {"idle/1": reading(7, 0, 0, 1, 0), "new/2": reading(9_000, 0, 0, 1, 0)}
        got = relay_cpu.per_call(before, after, calls=10)
        self.assertEqual(set(got), {"total"})
        self.assertEqual(got["total"]["cpu_us"], 0)

    def test_no_ticks_gives_no_user_share(self):
        got = relay_cpu.per_call({"t/1": reading(0, 0, 0, 0, 0)},
                                 {"t/1": reading(1_000, 0, 0, 1, 0)}, calls=1)
        self.assertIsNone(got["t"]["user_share"])


if __name__ == "__main__":
    unittest.main()
