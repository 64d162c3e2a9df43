// The msgpack mapping between JavaScript values and the sandbox's Python values
// (ENCODING_MSGPACK; proto/agentix/runtime/v1/README.md has the table):
//   number (integral) <-> int      number (fractional) <-> float
//   bigint            <-> int (64-bit; decoded ints beyond 2^53 arrive as bigint)
//   string <-> str    Uint8Array <-> bytes    Date <-> datetime (timestamp ext -1)
//   Array <-> list (a tuple arrives as an Array)    plain object / Map <-> dict
//   null/undefined <-> None    boolean <-> bool
import { Decoder, Encoder } from "@msgpack/msgpack";

const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: false });
const decoder = new Decoder({ useBigInt64: true });

/** Encodes call arguments as the wire wants them: `[args, kwargs]`. */
export function encodeArguments(args: readonly unknown[], kwargs: Record<string, unknown>): Uint8Array {
  return encoder.encode(widenInts([args, kwargs]));
}

export function encodeValue(value: unknown): Uint8Array {
  return encoder.encode(widenInts(value));
}

const INT64_MIN = -(2n ** 63n);
const UINT64_MAX = 2n ** 64n - 1n;

/**
 * A copy of `value` in which integral numbers beyond 32 bits are bigints, so
 * that they travel as msgpack ints (the encoder would send them as floats),
 * and bigints outside [-2^63, 2^64) are refused (they have no msgpack form).
 */
function widenInts(value: unknown): unknown {
  if (typeof value === "number") {
    return Number.isSafeInteger(value) && (value >= 2 ** 32 || value < -(2 ** 31)) ? BigInt(value) : value;
  }
  if (typeof value === "bigint") {
    if (value < INT64_MIN || value > UINT64_MAX) {
      throw new RangeError(`integer ${value} does not fit msgpack's 64 bits`);
    }
    return value;
  }
  if (Array.isArray(value)) return value.map(widenInts);
  if (value instanceof Map) return new Map([...value].map(([k, v]) => [widenInts(k), widenInts(v)]));
  if (value !== null && typeof value === "object" && !ArrayBuffer.isView(value) && !(value instanceof Date) &&
      !(value instanceof ArrayBuffer)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = widenInts(v);
    return out;
  }
  return value;
}

/** Decodes a result value; 64-bit integers that fit a double become numbers. */
export function decodeValue(bytes: Uint8Array): unknown {
  // A plain Uint8Array view, so that decoded `bytes` are Uint8Arrays, not Buffers.
  const view = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return narrowInts(decoder.decode(view));
}

function narrowInts(value: unknown): unknown {
  if (typeof value === "bigint") {
    return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value)
      : value;
  }
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) value[i] = narrowInts(value[i]);
    return value;
  }
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array) && !(value instanceof Date)) {
    const record = value as Record<string, unknown>;
    for (const key of Object.keys(record)) record[key] = narrowInts(record[key]);
  }
  return value;
}
