// @agentix/client: call Python functions in an agentix sandbox from TypeScript.
export { RuntimeClient } from "./client";
export type { CallOptions, ConnectOptions, Info, StreamOptions } from "./client";
export { ConnectionError, DeadlineExceeded, RemoteError } from "./errors";
export type { AttributeValue, LogRecord, SpanEvent, TraceEvent } from "./records";
export type { ReconnectPolicy } from "./retry";
export { Subscription } from "./subscription";
export type { SubscribeOptions } from "./subscription";
export { decodeValue, encodeValue } from "./codec";
