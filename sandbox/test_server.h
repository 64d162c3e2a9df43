// TestServer: a gRPC server for the daemon's unit tests, serving what `add`
// registers on one completion queue polled by a CompletionQueueThread, with
// an in-process channel to it.
#pragma once

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "sandbox/server_stream.h"

namespace agentix::sandbox {

// A Unix socket path for one test server, unique to this process and `name`
// (short: sun_path holds 108 bytes).
inline std::string TestSocketPath(const std::string& name) {
  return "/tmp/agx-" + name + "-" + std::to_string(::getpid()) + ".sock";
}

class TestServer {
 public:
  // The services `add` registers must outlive this object.
  // `spin`: the reaction thread's spin window (CompletionQueueThread).
  // `unix_socket`: also listen there (a real HTTP/2 transport with flow
  // control, unlike the in-process channel); SocketChannel() connects. A
  // file left there is removed first; Stop() removes the socket.
  explicit TestServer(const std::function<void(grpc::ServerBuilder&)>& add,
                      absl::Duration spin = absl::ZeroDuration(),
                      std::string unix_socket = "")
      : unix_socket_(std::move(unix_socket)) {
    grpc::ServerBuilder builder;
    add(builder);
    if (!unix_socket_.empty()) {
      ::unlink(unix_socket_.c_str());
      builder.AddListeningPort("unix:" + unix_socket_,
                               grpc::InsecureServerCredentials());
    }
    cq_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    reactions_ =
        std::make_unique<CompletionQueueThread>(cq_.get(), "test-cq", spin);
  }
  ~TestServer() { Stop(); }

  CompletionQueueThread* reactions() { return reactions_.get(); }
  std::shared_ptr<grpc::Channel> Channel() {
    return server_->InProcessChannel(grpc::ChannelArguments());
  }
  std::shared_ptr<grpc::Channel> SocketChannel() {
    return grpc::CreateChannel("unix:" + unix_socket_,
                               grpc::InsecureChannelCredentials());
  }

  // Shuts the server down (calls still open are cancelled after 2 s),
  // stops the queue's thread and removes the socket. Idempotent.
  void Stop() {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
    reactions_->Stop();
    server_.reset();
    if (!unix_socket_.empty()) ::unlink(unix_socket_.c_str());
  }

 private:
  const std::string unix_socket_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;  // outlives the server
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionQueueThread> reactions_;
};

}  // namespace agentix::sandbox
