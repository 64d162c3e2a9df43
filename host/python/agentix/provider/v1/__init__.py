"""Generated code for ``proto/agentix/provider/v1/provider.proto``:
``provider_pb2`` (messages) and ``provider_pb2_grpc`` (the ``ProviderService``
stub), used by `agentix.provider.service`.

Both modules are produced by ``//proto:provider_py`` and copied here at build
time (``//host/python:provider_stubs``); they are not checked in. The import
path is the proto package's (``agentix.provider.v1``), which the generated
``provider_pb2_grpc`` imports.
"""
