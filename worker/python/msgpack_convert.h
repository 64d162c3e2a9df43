// Converts between msgpack bytes and Python objects in C++, for calls made
// with encoding 2 (msgpack). The mapping matches the original agentix codec
// (msgpack-python with use_bin_type=True, raw=False, strict_map_key=True):
// nil/bool/int/float/str/bin/array/map <-> None/bool/int/float/str/bytes/
// list/dict; tuples encode as arrays; the timestamp extension (-1) <->
// aware datetime.datetime (UTC on decode, microseconds); other ext types
// are not supported. proto/agentix/runtime/v1/README.md has the table.
//
// Both functions sit on the C/Python edge: they require the GIL, never throw,
// and report failure as a set Python exception.
#pragma once

#include <Python.h>

#include <cstddef>
#include <string>

namespace agentix::worker {

// Decodes exactly one msgpack value from `data`. Returns a new reference, or
// nullptr with ValueError set (malformed or truncated input, trailing bytes,
// ext types other than timestamps, invalid UTF-8 in a str, map keys that are not str/bytes) or
// RecursionError (nesting deeper than Python allows).
PyObject* MsgpackToPython(const char* data, size_t size);

// Appends the msgpack encoding of `object` to `out`. Returns false with a
// Python exception set: TypeError for types msgpack cannot carry (and
// naive datetimes),
// OverflowError for ints outside [-2^63, 2^64), RecursionError for cycles.
// On failure `out` may hold a partial encoding.
bool PythonToMsgpack(PyObject* object, std::string& out);

}  // namespace agentix::worker
