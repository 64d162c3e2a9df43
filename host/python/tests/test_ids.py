"""Call ids (`agentix.runtime.shared.ids.UniqueIds` as the client uses it)."""

import json

from child_paths import run_in_fresh_interpreter

_FORKED_IDS = """
import json, os
from agentix.runtime.client.client import _call_ids
ids = [_call_ids.next() for _ in range(1000)]
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:  # the child reports its next id and leaves at once
    try:
        os.write(write_end, _call_ids.next().encode())
    finally:
        os._exit(0)
os.close(write_end)
child_id = os.read(read_end, 64).decode()
_, status = os.waitpid(pid, 0)
print(json.dumps({"ids": ids, "child": child_id, "status": status, "parent": _call_ids.next()}))
"""


def test_call_ids_are_distinct_across_calls_and_forks():
    # Forked from a fresh interpreter (child_paths.run_in_fresh_interpreter says why).
    seen = json.loads(run_in_fresh_interpreter(_FORKED_IDS).splitlines()[-1])
    ids = seen["ids"]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert seen["status"] == 0
    child_id, parent_id = seen["child"], seen["parent"]
    assert len(child_id) == 32 and child_id not in ids
    assert parent_id[:16] == ids[0][:16]  # the parent keeps its prefix ...
    assert child_id[:16] != parent_id[:16]  # ... and the child draws a fresh one
