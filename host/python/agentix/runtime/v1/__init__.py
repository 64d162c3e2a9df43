"""Generated code for ``proto/agentix/runtime/v1/runtime.proto``:
``runtime_pb2`` (messages) and ``runtime_pb2_grpc`` (service stubs).

Both modules are produced by ``//proto:runtime_py`` and copied here at build time
(``//host/python:runtime_stubs``); they are not checked in.
"""
