// Loads the wire contract (runtime.proto) and makes the gRPC client for it.
import * as fs from "fs";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

function protoPath(): string {
  // Packed: <pkg>/proto/runtime.proto. In the repository: proto/agentix/... .
  const packed = path.resolve(__dirname, "../proto/runtime.proto");
  if (fs.existsSync(packed)) return packed;
  return path.resolve(__dirname, "../../../proto/agentix/runtime/v1/runtime.proto");
}

const definition = protoLoader.loadSync(protoPath(), {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const runtimePackage = grpc.loadPackageDefinition(definition) as unknown as {
  agentix: { runtime: { v1: { RuntimeService: grpc.ServiceClientConstructor } } };
};

export type RuntimeStub = grpc.Client & {
  Calls(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<any, any>;
  Logs(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<any, any>;
  Traces(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<any, any>;
  GetInfo(request: object, metadata: grpc.Metadata, options: grpc.CallOptions,
          callback: (err: grpc.ServiceError | null, response: any) => void): grpc.ClientUnaryCall;
};

export function makeStub(address: string, credentials: grpc.ChannelCredentials,
                         options: grpc.ChannelOptions): RuntimeStub {
  const Ctor = runtimePackage.agentix.runtime.v1.RuntimeService;
  return new Ctor(address, credentials, options) as unknown as RuntimeStub;
}

/** Codes after which reconnecting cannot help: the caller must change something. */
export function isPermanent(code: grpc.status): boolean {
  return code === grpc.status.UNAUTHENTICATED || code === grpc.status.PERMISSION_DENIED ||
    code === grpc.status.UNIMPLEMENTED || code === grpc.status.INVALID_ARGUMENT;
}
