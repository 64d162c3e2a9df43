"""Which transport carries the Calls stream (and the Namespace streams with
it): the native extension unless
AGENTIX_NATIVE_TRANSPORT=0, and grpc.aio whenever the extension cannot be
loaded or refuses — the client never fails because of it."""

import logging
import sys
import types

import pytest

import agentix.runtime.client
from agentix.runtime.client import channels
import sandbox_functions
from agentix import RuntimeClient
from agentix.runtime.client.stream import CallsStream, NativeCallsStream

pytestmark = pytest.mark.asyncio
_MODULE = "agentix.runtime.client._native_calls"


@pytest.fixture
def native_on(monkeypatch):
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)


def replace_extension(monkeypatch, module) -> None:
    """Makes `from agentix.runtime.client import _native_calls` find `module`
    (None: the import fails with ImportError)."""
    monkeypatch.delattr(agentix.runtime.client, "_native_calls", raising=False)
    monkeypatch.setitem(sys.modules, _MODULE, module)
    # The client imports the extension once per process; make it try again.
    monkeypatch.setattr(channels, "_native_import", channels._NOT_TRIED)


async def calls_transport_of(url: str) -> type:
    async with RuntimeClient(url) as client:
        assert await client.remote(sandbox_functions.add, 2, 3) == 5
        return type(client._stream)


async def test_native_by_default_and_grpc_aio_when_turned_off(runtime, monkeypatch, native_on):
    assert await calls_transport_of(runtime.url) is NativeCallsStream
    monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
    assert await calls_transport_of(runtime.url) is CallsStream


async def test_an_extension_that_does_not_import_means_grpc_aio(runtime, monkeypatch, native_on, caplog):
    replace_extension(monkeypatch, None)
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        assert await calls_transport_of(runtime.url) is CallsStream
    (note,) = [r for r in caplog.records if "native Calls transport unavailable" in r.getMessage()]
    assert note.levelno == logging.DEBUG


async def test_an_extension_that_does_not_import_is_said_once_per_process(runtime, monkeypatch, native_on, caplog):
    replace_extension(monkeypatch, None)
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        for _ in range(3):
            assert await calls_transport_of(runtime.url) is CallsStream
    notes = [r for r in caplog.records if "native Calls transport unavailable" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.DEBUG]


class _Refusing(Exception):
    pass


def _refuse(*args, **kwargs):
    raise _Refusing("refused")


@pytest.mark.parametrize("refusing", ["Channel", "CallsTransport"])
async def test_an_extension_that_refuses_means_grpc_aio(runtime, monkeypatch, native_on, caplog, refusing):
    from agentix.runtime.client import _native_calls as real

    fake = types.SimpleNamespace(Channel=real.Channel, CallsTransport=real.CallsTransport)
    setattr(fake, refusing, _refuse)
    replace_extension(monkeypatch, fake)
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        assert await calls_transport_of(runtime.url) is CallsStream
    notes = [r for r in caplog.records if "native Calls transport failed" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.DEBUG]
    assert "refused" in notes[0].getMessage()


async def test_namespace_streams_follow_the_calls_stream_and_fall_back_alike(runtime, monkeypatch, native_on, caplog):
    from agentix import AsyncClientNamespace
    from agentix.runtime.client import _native_calls as real
    from agentix.runtime.client.namespaces import NamespaceStream, NativeNamespaceStream

    async def namespace_transport_of() -> type:
        client = RuntimeClient(runtime.url)
        client.register_namespace(AsyncClientNamespace("/plug"))
        async with client:
            assert await client.remote(sandbox_functions.add, 2, 3) == 5
            return type(client._namespace_streams["/plug"])

    assert await namespace_transport_of() is NativeNamespaceStream
    monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
    assert await namespace_transport_of() is NamespaceStream
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT")

    def refuse_namespace(channel, metadata=None, **options):
        if "method" in options:
            raise _Refusing("refused the Namespace method")
        return real.CallsTransport(channel, metadata, **options)

    replace_extension(monkeypatch, types.SimpleNamespace(Channel=real.Channel, CallsTransport=refuse_namespace))
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        assert await namespace_transport_of() is NamespaceStream
    notes = [r for r in caplog.records if "native Calls transport failed" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.DEBUG]
    assert "refused the Namespace method" in notes[0].getMessage()
