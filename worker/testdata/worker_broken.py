"""A module whose import fails, for the resolve-error test."""

raise RuntimeError("worker_broken refuses to import")


def f():
    return None
