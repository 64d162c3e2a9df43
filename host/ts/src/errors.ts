// Errors a caller sees. A failure inside the sandbox is a RemoteError carrying
// the Python exception's type name, message and traceback; transport problems
// are ConnectionError; a deadline the client enforced is DeadlineExceeded.
import { status as GrpcStatus } from "@grpc/grpc-js";

export interface RemoteErrorFields {
  type: string;
  message: string;
  traceback: string;
  cancelled: boolean;
  returncode?: number;
  code: number;
  typeModule: string;
  typeQualname: string;
}

/** The call failed in the sandbox (or the runtime refused it): CallError. */
export class RemoteError extends Error {
  readonly type: string;
  readonly traceback: string;
  readonly cancelled: boolean;
  readonly returncode?: number;
  /** The canonical gRPC status code that best describes the failure. */
  readonly code: number;
  readonly typeModule: string;
  readonly typeQualname: string;

  constructor(fields: RemoteErrorFields) {
    super(fields.message === "" ? fields.type : `${fields.type}: ${fields.message}`);
    this.name = "RemoteError";
    this.type = fields.type;
    this.traceback = fields.traceback;
    this.cancelled = fields.cancelled;
    this.returncode = fields.returncode;
    this.code = fields.code;
    this.typeModule = fields.typeModule;
    this.typeQualname = fields.typeQualname;
  }
}

/** The daemon could not be reached, or refused the credentials. */
export class ConnectionError extends Error {
  readonly code: GrpcStatus;
  constructor(message: string, code: GrpcStatus) {
    super(message);
    this.name = code === GrpcStatus.UNAUTHENTICATED ? "Unauthenticated" : "ConnectionError";
    this.code = code;
  }
}

/** The call's deadline passed; the client cancelled it in the sandbox. */
export class DeadlineExceeded extends Error {
  constructor(callable: string, timeoutMs: number) {
    super(`${callable} did not finish within ${timeoutMs} ms (cancelled in the sandbox)`);
    this.name = "DeadlineExceeded";
  }
}
