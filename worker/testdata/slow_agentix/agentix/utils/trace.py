"""The part of agentix.utils.trace the worker's trace forwarder uses."""

processors = []


class Processor:
    pass


def add_processor(processor):
    processors.append(processor)
