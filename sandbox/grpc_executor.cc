#include "sandbox/grpc_executor.h"

#include <grpc/grpc.h>

// Declared as libgrpc 1.51 defines it (src/core/lib/iomgr/executor.h),
// which its development package does not install.
namespace grpc_core {
class Executor {
 public:
  static void SetThreadingDefault(bool enable);
};
}  // namespace grpc_core

namespace agentix::sandbox {

void RunGrpcExecutorInline() {
  grpc_init();  // never released: a later grpc_init would restart threads
  grpc_core::Executor::SetThreadingDefault(false);
}

}  // namespace agentix::sandbox
