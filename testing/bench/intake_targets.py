"""Targets `worker_intake_ab.py` runs inside the sandbox besides `bench_targets`."""


async def anoop():
    """An async noop: runs on the worker's event loop, no pool thread."""
    return None
