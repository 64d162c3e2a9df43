#include "sandbox/server_stream.h"

#include <pthread.h>

namespace agentix::sandbox {

CompletionQueueThread::CompletionQueueThread(grpc::ServerCompletionQueue* cq,
                                             const char* name)
    : cq_(cq) {
  thread_ = std::thread([this] {
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) static_cast<Completion*>(tag)->Complete(ok);
  });
  pthread_setname_np(thread_.native_handle(), name);
}

void CompletionQueueThread::Stop() {
  if (!thread_.joinable()) return;
  cq_->Shutdown();
  thread_.join();
}

}  // namespace agentix::sandbox
