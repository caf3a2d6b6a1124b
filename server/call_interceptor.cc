#include "server/call_interceptor.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardopt {
namespace {

constexpr char kShardServicePrefix[] = "/shardopt.v1.ShardService/";

class CallInterceptor : public grpc::experimental::Interceptor {
 public:
  CallInterceptor(grpc::experimental::ServerRpcInfo* info, ServerMetrics* metrics)
      : method_(info->method() == nullptr ? "" : info->method()),
        metrics_(metrics),
        start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty() &&
          absl::StartsWith(method_, kShardServicePrefix)) {
        status = grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request to ", method_.substr(sizeof(kShardServicePrefix) - 1),
                         " is not a valid message of its type (it does not parse)"));
        methods->ModifySendStatus(status);
      }
      metrics_->RecordCall(
          method_, absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
          absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  ServerMetrics* const metrics_;
  const absl::Time start_;
};

class CallInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallInterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallInterceptor(info, metrics_);
  }

 private:
  ServerMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeCallInterceptorFactory(
    ServerMetrics* metrics) {
  return std::make_unique<CallInterceptorFactory>(metrics);
}

}  // namespace shardopt
