"""The host's CPU per replayed span, decode and replay apart, without gRPC.

Builds one `TracesResponse` of `--spans` spans shaped like `side_targets.span_burst`'s
(a SPAN_START and a SPAN_END each, one int attribute, a call id), then times on one
thread (thread CPU, best of `--reps`) what `TracesStream` does with it: the event
loop's `traces.decode_response` and the replay thread's `EventReplayer.replay` of
every event, with one processor that implements only `on_span_end` (as
`side_cpu.py`'s counter). It moves much less with the machine's load than a
pipeline does; compare host builds by running it from two venvs alternately:

    .venv-old/bin/python testing/bench/trace_replay_cpu.py
    .venv-test/bin/python testing/bench/trace_replay_cpu.py
"""

import argparse
import time

from agentix import trace
from agentix.runtime.client import traces
from agentix.runtime.v1 import runtime_pb2 as pb


def response(spans: int) -> bytes:
    message = pb.TracesResponse(instance_id="d41d8cd98f00b204")
    start = 1_764_670_000_000_000_000
    for i in range(spans):
        ids = dict(agentix_trace_id="trace_" + "ab" * 16, agentix_span_id=f"span_{i:024x}", name="s",
                   call_id="call_0123456789abcdef", worker_id="1a2b3c4d", trace_id=b"\x01" * 16,
                   span_id=i.to_bytes(8, "big"))
        attributes = [pb.Attribute(key="i", value=pb.AttributeValue(int_value=i))]
        message.events.append(pb.TraceEvent(seq=2 * i + 1, kind=pb.TRACE_EVENT_KIND_SPAN_START,
                                            start_time_unix_nanos=start + 3000 * i, attributes=attributes, **ids))
        message.events.append(pb.TraceEvent(seq=2 * i + 2, kind=pb.TRACE_EVENT_KIND_SPAN_END,
                                            start_time_unix_nanos=start + 3000 * i,
                                            end_time_unix_nanos=start + 3000 * i + 2000,
                                            attributes=attributes, **ids))
    return message.SerializeToString()


def best_us_per_span(fn, spans: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        began = time.thread_time_ns()
        fn()
        best = min(best, time.thread_time_ns() - began)
    return best / 1e3 / spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--python-spans", action="store_true",
                        help="build every Span in Python (trace_item), as before stop 25's native span_item")
    args = parser.parse_args()
    # What a Traces stream chooses before its first batch.
    if hasattr(traces, "choose_native"):
        traces.choose_native()
        if args.python_spans:
            traces._native_span = None
    else:  # a host from before stop 25: native stamps only
        traces._stamp = traces.native_stamp()
    message = response(args.spans)
    ended = 0

    class Count(trace.Processor):
        def on_span_end(self, span):
            nonlocal ended
            ended += 1

    trace.set_processors([Count()])
    _, events = traces.decode_response(message)
    kind = type(events[0]).__name__

    def replay():
        replay_one = traces.EventReplayer().replay
        for event in events:
            replay_one(event)

    decode = best_us_per_span(lambda: traces.decode_response(message), args.spans, args.reps)
    replayed = best_us_per_span(replay, args.spans, args.reps)
    if ended != args.spans * args.reps:
        raise AssertionError(f"{ended} spans ended, {args.spans * args.reps} replayed")
    spans = "python" if getattr(traces, "_native_span", None) is None else "native"
    print(f"µs per span ({kind}, {spans} spans, best of {args.reps}): decode {decode:.3f}, replay {replayed:.3f}, "
          f"both {decode + replayed:.3f}")


if __name__ == "__main__":
    main()
