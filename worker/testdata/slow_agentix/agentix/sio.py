"""The part of agentix.sio the worker's namespace bridge uses."""

bridge = None


def _install(new_bridge):
    global bridge
    bridge = new_bridge


def _deliver(namespace, event, payload):
    pass
