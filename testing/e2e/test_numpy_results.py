"""numpy results from a real sandbox (issue 18 item 3), and refusals whose advice works.

The worker pickles with protocol 5: contiguous arrays travel as numpy's `_frombuffer`
of an in-band buffer, the others as `_reconstruct` + BUILD (protocol 4's form); the host
decodes both without `allow_type` and without trusting the sandbox.
"""

import pickle
import re

import numpy
import pytest

import agentix
import numpy_targets as nt
from agentix import RestrictedUnpickleError
from agentix.runtime.shared import safepickle

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def strict_policy(monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", dict(safepickle._allowed_types))
    monkeypatch.setattr(safepickle, "_allowed_callables", dict(getattr(safepickle, "_allowed_callables", {})), raising=False)
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST", raising=False)


def _same(got, want):
    assert type(got) is numpy.ndarray
    assert got.dtype.str == want.dtype.str and got.shape == want.shape
    if got.dtype.names:  # built from zeros: padding included, the bytes are the value
        assert got.tobytes() == want.tobytes()
    else:  # values, not bytes: long double items carry padding bytes the sandbox left unset
        assert numpy.array_equal(got, want)
    assert got.flags.writeable == want.flags.writeable


def _as_pickle_gives(value):
    return pickle.loads(pickle.dumps(value, protocol=5))


async def test_every_array_kind_round_trips_as_a_result(client):
    got = await client.remote(nt.arrays)
    want = nt.arrays()
    assert sorted(got) == sorted(want)
    for name in want:
        _same(got[name], _as_pickle_gives(want[name]))


async def test_numpy_scalars_round_trip(client):
    got = await client.remote(nt.scalars)
    for value, want in zip(got, nt.scalars(), strict=True):
        assert type(value) is type(want) and value.dtype == want.dtype and value == want


async def test_large_arrays_contiguous_and_not(client):
    a, b = await client.remote(nt.large, 32 << 20)  # 32 MiB + 16 MiB
    want_a, want_b = nt.large(32 << 20)
    _same(a, want_a)
    _same(b, _as_pickle_gives(want_b))
    assert a.nbytes >= 30 << 20


async def test_arrays_as_stream_items(client):
    items = [item async for item in client.remote_stream(nt.stream_arrays, 20)]
    for got, want in zip(items, nt.stream_arrays(20), strict=True):
        _same(got, _as_pickle_gives(want))


async def test_object_arrays_stay_gated_and_the_client_keeps_working(client):
    with pytest.raises(RestrictedUnpickleError, match="holding Python objects"):
        await client.remote(nt.object_array)
    _same(await client.remote(numpy.arange, 4), numpy.arange(4))


def _advised(message, call):
    found = re.search(rf"agentix\.{call}\([^()]*\)", message)
    assert found, message
    return found.group(0)


async def test_a_refused_dataclass_holding_an_array_is_admitted_by_the_advised_call(client):
    with pytest.raises(RestrictedUnpickleError) as info:
        await client.remote(nt.measurement)
    call = _advised(str(info.value), "allow_type")
    assert call == "agentix.allow_type(numpy_targets.Measurement)"
    exec(f"import numpy_targets\n{call}", {"agentix": agentix})
    got = await client.remote(nt.measurement)
    assert type(got) is nt.Measurement and got.name == "m"
    _same(got.values, numpy.arange(3.0))


async def test_a_refused_reconstruction_function_is_admitted_by_the_advised_call(client):
    with pytest.raises(RestrictedUnpickleError) as info:
        await client.remote(nt.celsius, 21.5)
    call = _advised(str(info.value), "allow_callable")
    assert call == "agentix.allow_callable('numpy_targets', 'make_celsius')"
    exec(call, {"agentix": agentix})
    assert await client.remote(nt.celsius, 21.5) == nt.Celsius(21.5)
