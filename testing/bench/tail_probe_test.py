"""tail_probe's tick breakdown: where a call that meets the kernel tick loses its time."""

import random
import unittest

import tail_probe

US = 1000
TICK = 4000 * US
STACK, FOLLOWER, OTHER = {10, 11, 12}, {12}, 99


def switch(t, cpu, prev, nxt):
    return (t, cpu, "x", prev, "sched_switch",
            f"prev_comm=x prev_pid={prev} prev_prio=120 prev_state=S ==> "
            f"next_comm=y next_pid={nxt} next_prio=120")


def tick(t_entry, cpu, handler_us, now_after_due_us, kick=False):
    """The tick's interrupt on `cpu`: entry, the handler (its `now` that long
    after the period's due time), an idle-balance kick if asked, exit."""
    due_at = t_entry - (now_after_due_us - 1) * US
    now = due_at + now_after_due_us * US
    events = [(t_entry, cpu, "x", 0, "local_timer_entry", "vector=236"),
              (t_entry + US, cpu, "x", 0, "hrtimer_expire_entry",
               f"hrtimer=0xffff1 function=tick_nohz_handler now={now}")]
    if kick:
        events.append((t_entry + 2 * US, cpu, "x", 0, "ipi_send_cpu",
                       "cpu=0 callsite=generic_exec_single+0x9c target=nohz_csd_func"))
    events.append((t_entry + handler_us * US, cpu, "x", 0, "local_timer_exit", "vector=236"))
    return events


class TickBreakdownTest(unittest.TestCase):
    def setUp(self):
        # Ten plain calls of 50 us (the median) on CPU 1, away from any tick.
        self.starts = [TICK // 2 + i * 100 * US for i in range(10)]
        self.lats = [50 * US] * 10
        self.events = [switch(s + 5 * US, 1, 10, 11) for s in self.starts]

    def call(self, start, lat, events):
        self.starts.append(start)
        self.lats.append(lat)
        self.events.extend(events)

    def breakdown(self):
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        return tail_probe.tick_breakdown(
            sorted(self.events), [self.starts[i] for i in order],
            [self.lats[i] for i in order], 100 * US, STACK, FOLLOWER)

    def test_a_kicking_tick_is_split_into_stall_handler_softirq_others_and_rest(self):
        t0 = TICK - 10 * US  # the call starts 10 us before the tick is due
        self.call(t0, 120 * US, [
            switch(t0 + 5 * US, 1, 10, 11),
            # no event from the due time until the interrupt: a 20 us stall
            *tick(TICK + 20 * US, 1, handler_us=30, now_after_due_us=21, kick=True),
            (TICK + 51 * US, 1, "x", 11, "softirq_entry", "vec=7 [action=SCHED]"),
            (TICK + 56 * US, 1, "x", 11, "softirq_exit", "vec=7 [action=SCHED]"),
            switch(TICK + 60 * US, 1, 11, OTHER),  # another process runs 10 us
            switch(TICK + 70 * US, 1, OTHER, 11),
        ])
        # A tick without a kick, lasting 12 us after a 15 us stall.
        t1 = 2 * TICK - 10 * US
        self.call(t1, 90 * US, [switch(t1 + 5 * US, 1, 10, 11),
                                *tick(2 * TICK + 15 * US, 1, handler_us=12, now_after_due_us=16)])
        out = self.breakdown()
        self.assertEqual(out["tick_period_us"], 4000.0)
        kick, plain = out["kick"], out["no_kick"]
        self.assertEqual((kick["calls"], plain["calls"]), (1, 1))
        self.assertEqual(kick["share_slow"], 1.0)  # 120 us > the threshold of 100
        self.assertEqual(plain["share_slow"], 0.0)
        self.assertEqual(kick["excess_us_p10_p50_p90"][1], 70.0)
        self.assertEqual(kick["stall_us_p10_p50_p90"][1], 20.0)
        self.assertEqual(kick["handler_us_p10_p50_p90"][1], 30.0)
        self.assertEqual(kick["softirq_us_p10_p50_p90"][1], 5.0)
        self.assertEqual(kick["others_us_p10_p50_p90"][1], 10.0)
        self.assertEqual(kick["rest_us_p10_p50_p90"][1], 5.0)
        self.assertEqual(plain["excess_us_p10_p50_p90"][1], 40.0)
        self.assertEqual(plain["stall_us_p10_p50_p90"][1], 15.0)
        self.assertEqual(plain["handler_us_p10_p50_p90"][1], 12.0)
        self.assertEqual(plain["rest_us_p10_p50_p90"][1], 13.0)

    def test_progress_after_the_due_time_is_not_stall(self):
        t0 = TICK - 10 * US
        # The call's thread switches 8 us after the due time: the stall starts there.
        self.call(t0, 100 * US, [switch(TICK + 8 * US, 1, 10, 11),
                                 *tick(TICK + 20 * US, 1, handler_us=12, now_after_due_us=21)])
        # (a second tick, in a call with no thread of the stack, gives the period)
        self.call(2 * TICK - 10 * US, 60 * US,
                  tick(2 * TICK + 5 * US, 1, handler_us=12, now_after_due_us=6))
        self.assertEqual(self.breakdown()["no_kick"]["stall_us_p10_p50_p90"][1], 12.0)

    def test_a_tick_on_the_followers_cpu_only_is_not_the_calls(self):
        t0 = TICK - 10 * US
        self.call(t0, 60 * US, [switch(t0 + 5 * US, 1, 10, 11),
                                switch(t0 + 6 * US, 0, 0, 12),  # the follower wakes on CPU 0
                                *tick(TICK + 20 * US, 0, handler_us=12, now_after_due_us=21)])
        self.call(2 * TICK, 60 * US, tick(2 * TICK + 20 * US, 0, handler_us=12,
                                          now_after_due_us=21))
        out = self.breakdown()
        self.assertEqual(out["kick"]["calls"] + out["no_kick"]["calls"], 0)

    def test_no_tick_in_the_trace_gives_nothing(self):
        self.assertEqual(self.breakdown(), {})


def wakeup(t, cpu, tid, target):
    return (t, cpu, "x", 0, "sched_wakeup", f"comm=x pid={tid} prio=120 target_cpu={target:03d}")


def preempt(t, cpu, prev, nxt):
    """prev stays runnable (a wake-up preemption)."""
    return (t, cpu, "x", prev, "sched_switch",
            f"prev_comm=x prev_pid={prev} prev_prio=120 prev_state=R+ ==> "
            f"next_comm=y next_pid={nxt} next_prio=120")


class RunnableAtTicksTest(unittest.TestCase):
    def test_a_preempted_waker_counts_until_it_blocks(self):
        timer = lambda t, cpu: (t, cpu, "x", 0, "local_timer_entry", "vector=236")
        events = [
            switch(1 * US, 1, 0, 10),         # 10 runs on CPU 1
            timer(2 * US, 1),                 # alone: 1
            wakeup(3 * US, 1, 11, 1),         # 10 wakes 11 there
            preempt(4 * US, 1, 10, 11),       # and is preempted: both runnable
            timer(5 * US, 1),                 # 2
            wakeup(6 * US, 1, 12, 0),         # a thread woken on the other CPU
            timer(7 * US, 0),                 # 1 there
            switch(8 * US, 1, 11, 10),        # 11 blocks; 10 runs again
            timer(9 * US, 1),                 # 1
            (10 * US, 0, "x", 0, "sched_migrate_task",
             "comm=x pid=12 prio=120 orig_cpu=0 dest_cpu=1"),
            timer(11 * US, 1),                # 10 and the migrated 12: 2
            timer(12 * US, 0),                # 0
        ]
        self.assertEqual(tail_probe.runnable_at_ticks(events), {
            (2 * US, 1): 1, (5 * US, 1): 2, (7 * US, 0): 1, (9 * US, 1): 1,
            (11 * US, 1): 2, (12 * US, 0): 0})

    def test_a_thread_whose_switch_away_is_lost_is_not_counted(self):
        timer = lambda t, cpu: (t, cpu, "x", 0, "local_timer_entry", "vector=236")
        events = [switch(1 * US, 1, 0, 10), wakeup(2 * US, 1, 13, 1),
                  preempt(3 * US, 1, 10, 13),  # 13 runs; 10 waits
                  switch(4 * US, 1, 14, 10),   # next switch names 14 as prev: 13's is lost
                  timer(5 * US, 1)]
        self.assertEqual(tail_probe.runnable_at_ticks(events), {(5 * US, 1): 1})

    def test_the_breakdown_reports_the_share_of_ticks_with_two_or_more(self):
        case = TickBreakdownTest("test_no_tick_in_the_trace_gives_nothing")
        case.setUp()
        t0 = TICK - 10 * US
        case.call(t0, 120 * US, [switch(t0 + 5 * US, 1, 10, 11), wakeup(t0 + 6 * US, 1, 10, 1),
                                 *tick(TICK + 20 * US, 1, handler_us=30, now_after_due_us=21,
                                       kick=True)])
        t1 = 2 * TICK - 10 * US
        case.call(t1, 90 * US, [switch(t1 + 5 * US, 1, 10, 11),
                                *tick(2 * TICK + 15 * US, 1, handler_us=12, now_after_due_us=16)])
        out = case.breakdown()
        self.assertEqual(out["kick"]["share_runnable_2_or_more"], 1.0)   # 11 running, 10 woken
        self.assertEqual(out["no_kick"]["share_runnable_2_or_more"], 0.0)  # 11 alone


class TickThreadsTest(unittest.TestCase):
    NAMES = {10: "host/python3", 11: "worker/agentix-worker", 12: "worker/pool"}

    def test_the_tick_calls_excess_is_split_by_who_had_the_cpu(self):
        starts, lats = [], []
        events = []
        # Two clean calls of 50 us on CPU 1: the host 20 us, the worker 30.
        for t0 in (TICK // 2, TICK // 2 + 100 * US):
            starts.append(t0)
            lats.append(50 * US)
            events += [switch(t0 - US, 1, 0, 10), switch(t0 + 20 * US, 1, 10, 11),
                       switch(t0 + 50 * US, 1, 11, 0)]
        # A call that meets the tick: the host 20 us, then the interrupt's 10
        # us (taken from the worker), another process 15, the worker 30 more.
        t0 = TICK - 25 * US
        starts.append(t0)
        lats.append(90 * US)
        events += [switch(t0 - US, 1, 0, 10), switch(t0 + 20 * US, 1, 10, 11),
                   (t0 + 25 * US, 1, "x", 11, "local_timer_entry", "vector=236"),
                   (t0 + 35 * US, 1, "x", 11, "local_timer_exit", "vector=236"),
                   switch(t0 + 40 * US, 1, 11, OTHER), switch(t0 + 55 * US, 1, OTHER, 11),
                   switch(t0 + 90 * US, 1, 11, 0),
                   switch(t0 + 30 * US, 0, 0, 12), switch(t0 + 34 * US, 0, 12, 0)]
        out = tail_probe.tick_threads(sorted(events), starts, lats, {10, 11, 12}, set(),
                                      self.NAMES)
        self.assertEqual(out["calls"], {"tick": 1, "clean": 2})
        clean, hit = out["mean_us"]["clean"], out["mean_us"]["tick"]
        self.assertEqual((clean["host/python3"], clean["worker/agentix-worker"]), (20.0, 30.0))
        self.assertEqual(clean["switches"], 1.0)
        self.assertEqual((hit["host/python3"], hit["irq"], hit["other_processes"]),
                         (20.0, 10.0, 15.0))
        self.assertEqual(hit["worker/agentix-worker"], 45.0)  # 55 on the CPU less 10 of irq
        self.assertEqual(hit["stack_on_other_cpus"], 4.0)     # the pool thread on CPU 0
        self.assertEqual(hit["switches"], 3.0)
        diff = out["tick_minus_clean_us"]
        self.assertEqual(diff["latency"], 40.0)
        self.assertEqual(diff["worker/agentix-worker"] + diff["irq"] + diff["other_processes"]
                         + diff["host/python3"] + diff["idle"], 40.0)

    def test_without_a_clean_call_nothing(self):
        self.assertEqual(tail_probe.tick_threads([], [0], [50 * US], {10}, set(), {}), {})


class TickLossTest(unittest.TestCase):
    def test_the_excess_near_each_boundary_less_the_baseline_half_a_period_later(self):
        # Calls of 50 us back to back over 5 periods; the one spanning each
        # boundary takes 110 us (60 over), and one call each mid-period 60 us.
        starts, lats, t = [], [], 0
        while t < 5 * TICK:
            lat = 50 * US
            if t <= (t // TICK + 1) * TICK - 10 * US < t + 50 * US and t > TICK // 2:
                lat = 110 * US
            elif t <= (t // TICK) * TICK + TICK // 2 < t + 50 * US:
                lat = 60 * US
            starts.append(t)
            lats.append(lat)
            t += lat
        out = tail_probe.tick_loss(starts, lats)
        self.assertEqual(out["ticks"], 3)
        self.assertEqual((out["p25_us"], out["p50_us"], out["p75_us"]), (50.0, 50.0, 50.0))

    def test_too_short_a_stream_gives_nothing(self):
        self.assertEqual(tail_probe.tick_loss([0, 100 * US], [50 * US, 50 * US]), {})


class PeriodTest(unittest.TestCase):
    CALLS = 30000

    def test_a_stall_every_n_calls_stands_out_at_its_lag(self):
        slow = sorted(set(range(10, self.CALLS, 65)) | set(range(7, self.CALLS, 997)))
        found = tail_probe.spacing(slow, self.CALLS)["period"]
        self.assertEqual(found["top_lags"][0]["lag"] % 65, 0)
        self.assertGreater(found["top_lags"][0]["over_neighbours"], 5)

    def test_clustered_slow_calls_show_no_period(self):
        # Bursts of slow calls (a loaded machine's episodes) at irregular
        # places, irregular inside too.
        rng = random.Random(25)
        slow = set()
        for start in rng.sample(range(self.CALLS - 500), 12):
            slow |= {start + k for k in range(300) if rng.random() < 0.3}
        found = tail_probe.spacing(sorted(slow), self.CALLS)["period"]
        self.assertGreater(found["lag_1"], 5 * found["base_rate"])
        self.assertLess(found["top_lags"][0]["over_neighbours"], 2)

    def test_gaps_of_65_or_more_share_one_labelled_bin(self):
        slow = [0, 65, 200, 1000, 1001]
        hist = tail_probe.spacing(slow, 2000)["gap_histogram"]
        self.assertEqual(hist, {"1": 1, "65+": 3})


def fault(t, cpu, tid):
    return (t, cpu, "x", tid, "page_fault_user",
            "address=0x7f0000001000 ip=0x7f0000000100 error_code=0x6")


class CausesTest(unittest.TestCase):
    NO_TIMERS = (set(), set())

    def setUp(self):
        # Nine 50 us calls and one of 200 us (the slow one, index 5), on CPU 1.
        self.starts = [i * 1000 * US for i in range(10)]
        self.lats = [50 * US] * 10
        self.lats[5] = 200 * US
        self.slow_start = self.starts[5]

    def causes(self, events):
        return tail_probe.causes(sorted(events), self.starts, self.lats, 100 * US, STACK,
                                 self.NO_TIMERS)

    def test_a_stack_threads_page_fault_is_the_slow_calls_cause(self):
        found = self.causes([switch(self.slow_start + 5 * US, 1, 10, 11),
                             fault(self.slow_start + 20 * US, 1, 11)])
        self.assertEqual(found["stack_page_fault"], 0.1)
        self.assertEqual(found["none_seen"], 0)

    def test_another_processs_fault_is_not_the_stacks(self):
        found = self.causes([switch(self.slow_start + 5 * US, 1, 10, 11),
                             fault(self.slow_start + 20 * US, 0, OTHER)])
        self.assertEqual(found["stack_page_fault"], 0)
        self.assertEqual(found["none_seen"], 0.1)

    def test_a_tick_comes_before_a_fault_in_the_same_call(self):
        found = self.causes([switch(self.slow_start + 5 * US, 1, 10, 11),
                             fault(self.slow_start + 20 * US, 1, 11)]
                            + tick(self.slow_start + 30 * US, 1, 10, 5))
        self.assertEqual(found["tick_on_stack_cpu"], 0.1)
        self.assertEqual(found["stack_page_fault"], 0)

    def test_the_busy_spinner_on_the_stacks_cpu_is_its_own_cause(self):
        spinner = OTHER + 1
        run = [switch(self.slow_start + 5 * US, 1, 10, spinner),
               switch(self.slow_start + 150 * US, 1, spinner, 11)]
        found = tail_probe.causes(sorted(run), self.starts, self.lats, 100 * US, STACK,
                                  self.NO_TIMERS, spinner)
        self.assertEqual(found["busy_spinner_on_stack_cpu"], 0.1)
        self.assertEqual(found["foreign_thread_on_stack_cpu"], 0)
        # Without --busy the same thread is any other process's.
        found = self.causes(run)
        self.assertEqual(found["busy_spinner_on_stack_cpu"], 0)
        self.assertEqual(found["foreign_thread_on_stack_cpu"], 0.1)

    def test_a_fault_in_a_fast_call_counts_nothing(self):
        found = self.causes([switch(self.starts[2] + 5 * US, 1, 10, 11),
                             fault(self.starts[2] + 20 * US, 1, 11)])
        self.assertEqual(sum(found.values()), 0.1)  # the slow call alone, none seen
        self.assertEqual(found["stack_page_fault"], 0)


class ResidueTest(unittest.TestCase):
    CALLS = 30000

    def test_a_call_slower_every_256_stands_out_at_its_residue(self):
        rng = random.Random(35)
        lats = [rng.gauss(78_000, 8_000) for _ in range(self.CALLS)]
        for i in range(11, self.CALLS, 256):
            lats[i] += 45_000
        found = tail_probe.by_residue(lats)
        self.assertEqual(found["256"]["residue"], 11)
        self.assertGreater(found["256"]["median_over_residues"], 1.4)
        self.assertEqual(found["512"]["residue"] % 256, 11)
        self.assertLess(found["16"]["median_over_residues"], 1.1)  # 1 call in 16 of residue 11

    def test_no_period_gives_no_residue_far_above_the_others(self):
        rng = random.Random(36)
        lats = [rng.gauss(78_000, 8_000) for _ in range(self.CALLS)]
        for n, found in tail_probe.by_residue(lats).items():
            self.assertLess(found["median_over_residues"], 1.1, n)


if __name__ == "__main__":
    unittest.main()
