#include "sandbox/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <atomic>

namespace agentix::sandbox {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

namespace {

// Adds `file` and, first, the files it imports, skipping those in `sent`.
void AddFile(const FileDescriptor* file, std::vector<std::string>& sent,
             grpc::reflection::v1::FileDescriptorResponse* out) {
  if (std::find(sent.begin(), sent.end(), file->name()) != sent.end()) return;
  sent.push_back(file->name());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFile(file->dependency(i), sent, out);
  }
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
}

}  // namespace

// One ServerReflectionInfo stream: read a request, write its answer, until
// the client half-closes.
class ReflectionV1Service::ReflectionStream final
    : public ServerStream<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit ReflectionStream(const ReflectionV1Service* reflection)
      : reflection_(reflection) {}

 private:
  void OnStart() override { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    response_ = reflection_->Answer(request_, sent_);
    StartWrite(&response_);
  }
  void OnBadMessage(const std::string& error) override {
    FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "unparseable ServerReflectionRequest (" + error +
                                ")"));
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      StartRead(&request_);
    } else {
      FinishOnce(grpc::Status::CANCELLED);
    }
  }
  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }

  void FinishOnce(grpc::Status status) {
    if (!finishing_.exchange(true)) Finish(std::move(status));
  }

  const ReflectionV1Service* const reflection_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  std::vector<std::string> sent_;
  std::atomic<bool> finishing_{false};
};

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_([&] {
        services.push_back("grpc.reflection.v1.ServerReflection");
        services.push_back("grpc.reflection.v1alpha.ServerReflection");
        return services;
      }()) {}

void ReflectionV1Service::Start(CompletionQueueThread* thread) {
  thread_ = thread;
  AwaitNext();
}

void ReflectionV1Service::AwaitNext() {
  auto* stream = new ReflectionStream(this);
  stream->AwaitCall(
      [this](grpc::ServerContext* context, ReflectionStream::Stream* s,
             grpc::ServerCompletionQueue* queue, void* tag) {
        service_.RequestServerReflectionInfo(context, s, queue, queue, tag);
      },
      thread_, [this] { AwaitNext(); });
}

ServerReflectionResponse ReflectionV1Service::Answer(
    const ServerReflectionRequest& request,
    std::vector<std::string>& sent) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  auto not_found = [&](const std::string& what) {
    auto* error = response.mutable_error_response();
    error->set_error_code(static_cast<int>(grpc::StatusCode::NOT_FOUND));
    error->set_error_message(what + " not found");
  };
  auto add_file = [&](const FileDescriptor* file) {
    // Every file named by one request goes out, even if sent before.
    sent.erase(std::remove(sent.begin(), sent.end(), file->name()),
               sent.end());
    AddFile(file, sent, response.mutable_file_descriptor_response());
  };
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices: {
      auto* list = response.mutable_list_services_response();
      for (const auto& name : services_) list->add_service()->set_name(name);
      break;
    }
    case ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file =
          pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        not_found("file " + request.file_by_filename());
      } else {
        add_file(file);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file =
          pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        not_found("symbol " + request.file_containing_symbol());
      } else {
        add_file(file);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(ext.containing_type());
      const auto* field =
          type == nullptr
              ? nullptr
              : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        not_found("extension " + std::to_string(ext.extension_number()) +
                  " of " + ext.containing_type());
      } else {
        add_file(field->file());
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        not_found("type " + request.all_extension_numbers_of_type());
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* field : extensions) {
        numbers->add_extension_number(field->number());
      }
      break;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET: {
      auto* error = response.mutable_error_response();
      error->set_error_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      error->set_error_message("the request names nothing to reflect on");
      break;
    }
  }
  return response;
}

}  // namespace agentix::sandbox
