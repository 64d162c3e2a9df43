"""The part of agentix.utils.trace the worker's trace forwarder uses."""

import agentix  # noqa: F401  (as the real module: it imports the package)

processors = []


class Processor:
    pass


def add_processor(processor):
    processors.append(processor)
