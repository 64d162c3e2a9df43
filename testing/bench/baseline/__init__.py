"""A model of the ORIGINAL Agentix remote-call wire, used as the benchmark's baseline.

Not the original code: a faithful re-implementation of its hot path, written from
shared/SPEC.md §1.2 and §2.1-2.7 (see testing/bench/README.md for what is and is not
modelled). Parts:

- codec.py:  msgpack pack/unpack as the original's codec, and the u32-LE worker pipe framing.
- worker.py: the Python worker subprocess (frames on a pipe, pickle in/out, thread pool).
- server.py: the in-sandbox python-socketio server (`/rpc` namespace) that forwards to it.
- client.py: the host client (socketio.AsyncClient, per-call futures, `ack`).
"""
