"""`agentix-sio-gateway`: the original Agentix wire, served in front of the gRPC daemon.

Legacy hosts and providers speak HTTP/1 and Socket.IO (SPEC §2): ``GET /health``,
``POST /call`` (the msgpack fast path) and Engine.IO v4 / Socket.IO v5 on
``/socket.io`` with the ``/rpc``, ``/log``, ``/trace`` and plugin namespaces. The
gateway serves exactly that wire with Debian's python-socketio / python-engineio on
aiohttp (the same protocol implementation the legacy hosts use) and translates it
onto one `agentix.RuntimeClient` of the daemon: calls on its ``Calls`` stream, log
records and trace events from its ``Logs`` / ``Traces`` streams, plugin namespaces
on one ``Namespace`` stream per path. See docs/GATEWAY.md for the field-by-field
compatibility notes.

    python -m agentix.gateway --daemon unix:///run/agentix/agentix.sock --port 8000
"""

from agentix.gateway.server import HEALTH_VERSION, Gateway

__all__ = ["HEALTH_VERSION", "Gateway"]
