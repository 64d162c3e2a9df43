"""agentix.runtime.shared.codec: the msgpack codec of namespace payloads."""

import msgpack
import pytest

from agentix.runtime.shared import codec
from agentix.runtime.shared.codec import ExtDecodeError, pack, unpack


def test_round_trip_keeps_str_and_bytes_apart():
    value = {"s": "text", "b": b"\x00\xff", "n": [1, 2.5, None, True], "nested": {"k": "v"}}
    assert unpack(pack(value)) == value
    assert unpack(pack((1, 2))) == [1, 2]


def test_unencodable_values_raise_type_error():
    with pytest.raises(TypeError, match="cannot encode object"):
        pack(object())


def test_pydantic_like_models_encode_as_their_dump():
    class Model:
        model_fields = {"a": None}

        def model_dump(self, mode):
            assert mode == "python"
            return {"a": 1, "b": b"x"}

    assert unpack(pack({"m": Model()})) == {"m": {"a": 1, "b": b"x"}}


def test_malformed_extensions():
    with pytest.raises(ExtDecodeError, match="pydantic ext: malformed payload"):
        unpack(msgpack.packb(msgpack.ExtType(2, msgpack.packb([1]))))
    with pytest.raises(ExtDecodeError):
        unpack(msgpack.packb(msgpack.ExtType(2, b"\xc1")))
    array = msgpack.packb(msgpack.ExtType(1, b"<f8|2\x00" + b"\x00" * 16))
    try:
        import numpy
    except ImportError:  # without numpy an ndarray cannot be decoded, with a clear error
        with pytest.raises(ExtDecodeError, match="numpy is not installed"):
            unpack(array)
    else:
        assert unpack(array).tolist() == [0.0, 0.0]
        with pytest.raises(ExtDecodeError, match="does not match"):
            unpack(msgpack.packb(msgpack.ExtType(1, b"<f8|3\x00" + b"\x00" * 16)))
        assert numpy is not None
    assert issubclass(ExtDecodeError, ValueError)


def test_unknown_extensions_decode_to_inert_ext_type():
    assert unpack(msgpack.packb(msgpack.ExtType(42, b"abc"))) == msgpack.ExtType(42, b"abc")


def test_pydantic_nesting_is_bounded():
    payload = msgpack.packb({"leaf": 1})
    for _ in range(codec._MAX_PYDANTIC_DEPTH + 1):
        payload = msgpack.packb(msgpack.ExtType(2, msgpack.packb({"inner": msgpack.ExtType(2, payload)})))
    with pytest.raises(ExtDecodeError):
        unpack(payload)
    assert codec._pydantic_depth == 0


def test_a_failed_pack_leaves_nothing_behind_for_the_next():
    # pack reuses one Packer per thread: a value refused halfway must not leave
    # its first bytes in front of the next value's.
    with pytest.raises(TypeError):
        pack({"a": "partly written", "b": object()})
    assert pack({"c": 1}) == msgpack.packb({"c": 1}, use_bin_type=True)


def test_nested_and_concurrent_packs_each_get_their_own_bytes():
    import threading

    class Model:
        model_fields = {"a": None}

        def model_dump(self, mode):
            return {"inner": [1, 2, 3]}  # packed by a pack() nested in the outer one

    outer = {"m": Model(), "after": "tail"}
    assert unpack(pack(outer)) == {"m": {"inner": [1, 2, 3]}, "after": "tail"}

    results, errors = [], []

    def worker(n):
        try:
            for i in range(2000):
                value = {"thread": n, "i": i, "m": Model()}
                if unpack(pack(value)) != {"thread": n, "i": i, "m": {"inner": [1, 2, 3]}}:
                    errors.append((n, i))
            results.append(n)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(results) == [0, 1, 2, 3]
