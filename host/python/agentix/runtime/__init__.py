"""The remote-call runtime: the host client (`agentix.runtime.client`), pieces
shared with the sandbox (`agentix.runtime.shared`) and the generated gRPC
contract (`agentix.runtime.v1`)."""
