// Log records and trace events as a TypeScript caller sees them (camelCase,
// 64-bit times as bigint, attributes as a plain object).
import { decodeValue } from "./codec";

export interface LogRecord {
  seq: number;
  logger: string;
  level: number;
  levelName: string;
  message: string;
  timeUnixNanos: bigint;
  file: string;
  line: number;
  function: string;
  module: string;
  exceptionText: string;
  /** "LOG_ORIGIN_LOGGING", "LOG_ORIGIN_STDOUT", "LOG_ORIGIN_STDERR" or "LOG_ORIGIN_RUNTIME". */
  origin: string;
  workerId: string;
  callId: string;
  context: string;
  extras: Record<string, unknown>;
  stackInfo: string;
}

export type AttributeValue = string | boolean | number | bigint | Uint8Array;

export interface SpanEvent {
  name: string;
  timeUnixNanos: bigint;
  attributes: Record<string, AttributeValue>;
}

export interface TraceEvent {
  seq: number;
  /** "TRACE_EVENT_KIND_TRACE_START", "..._TRACE_END", "..._SPAN_START", "..._SPAN_END". */
  kind: string;
  traceId: Uint8Array;
  spanId: Uint8Array;
  parentSpanId: Uint8Array;
  agentixTraceId: string;
  agentixSpanId: string;
  agentixParentId: string;
  name: string;
  startTimeUnixNanos: bigint;
  endTimeUnixNanos: bigint;
  attributes: Record<string, AttributeValue>;
  events: SpanEvent[];
  status: string;
  statusDescription: string;
  errorMessage: string;
  errorData: Record<string, AttributeValue>;
  callId: string;
  workerId: string;
}

export function toLogRecord(r: any): LogRecord {
  let extras: Record<string, unknown> = {};
  if (r.extras && r.extras.length > 0) {
    const decoded = decodeValue(r.extras);
    if (decoded !== null && typeof decoded === "object") extras = decoded as Record<string, unknown>;
  }
  return {
    seq: Number(r.seq), logger: r.logger, level: r.level, levelName: r.level_name,
    message: r.message, timeUnixNanos: BigInt(r.time_unix_nanos), file: r.file, line: r.line,
    function: r.function, module: r.module, exceptionText: r.exception_text, origin: r.origin,
    workerId: r.worker_id, callId: r.call_id, context: r.context, extras, stackInfo: r.stack_info,
  };
}

function attributeValue(v: any): AttributeValue {
  switch (v?.value) {
    case "string_value": return v.string_value;
    case "bool_value": return v.bool_value;
    case "int_value": {
      const n = BigInt(v.int_value);
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n;
    }
    case "double_value": return v.double_value;
    case "bytes_value": return new Uint8Array(v.bytes_value);
    default: return "";
  }
}

function attributes(list: any[]): Record<string, AttributeValue> {
  const out: Record<string, AttributeValue> = {};
  for (const a of list ?? []) out[a.key] = attributeValue(a.value);
  return out;
}

export function toTraceEvent(e: any): TraceEvent {
  return {
    seq: Number(e.seq), kind: e.kind, traceId: new Uint8Array(e.trace_id),
    spanId: new Uint8Array(e.span_id), parentSpanId: new Uint8Array(e.parent_span_id),
    agentixTraceId: e.agentix_trace_id, agentixSpanId: e.agentix_span_id,
    agentixParentId: e.agentix_parent_id, name: e.name,
    startTimeUnixNanos: BigInt(e.start_time_unix_nanos), endTimeUnixNanos: BigInt(e.end_time_unix_nanos),
    attributes: attributes(e.attributes),
    events: (e.events ?? []).map((s: any) => ({
      name: s.name, timeUnixNanos: BigInt(s.time_unix_nanos), attributes: attributes(s.attributes),
    })),
    status: e.status, statusDescription: e.status_description, errorMessage: e.error_message,
    errorData: attributes(e.error_data), callId: e.call_id, workerId: e.worker_id,
  };
}
