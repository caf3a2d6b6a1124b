#include "server/reflection_limits.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace shardopt {
namespace {

constexpr char kReflectionPrefix[] = "/grpc.reflection.";

class ReflectionLimits : public grpc::experimental::Interceptor {
 public:
  ReflectionLimits(grpc::experimental::ServerRpcInfo* info, StreamWatchdog* watchdog,
                   std::atomic<int>* open, int max_open)
      : context_(info->server_context()), watchdog_(watchdog), open_(open), max_open_(max_open) {}

  ~ReflectionLimits() override {
    if (admitted_) open_->fetch_sub(1);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    // (At the first hook, not at construction: the call is bound to its
    // context by then, so that TryCancel reaches it.)
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      if (open_->fetch_add(1) < max_open_) {
        admitted_ = true;
        watch_.emplace(watchdog_, context_);
      } else {
        open_->fetch_sub(1);
        LogRefusal();
        context_->TryCancel();
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        watch_.has_value()) {
      watch_->Touch();
    }
    // The handler is done: the watchdog lets go of the context here, not in
    // the interceptor's destructor, which runs while gRPC destroys the
    // context (a TryCancel then would reach interceptors already gone).
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      watch_.reset();
    }
    methods->Proceed();
  }

 private:
  // One line per second at most: refusals come in floods.
  void LogRefusal() {
    static std::atomic<int64_t> last_logged_ms{0};
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    int64_t last = last_logged_ms.load();
    if (now_ms - last >= 1000 && last_logged_ms.compare_exchange_strong(last, now_ms)) {
      LogWarning("refused a reflection stream from %s: %d are open already (logged once a second)",
                 context_->peer(), max_open_);
    }
  }

  grpc::ServerContextBase* const context_;
  StreamWatchdog* const watchdog_;
  std::atomic<int>* const open_;
  const int max_open_;
  bool admitted_ = false;
  std::optional<StreamWatchdog::Watch> watch_;
};

class ReflectionLimitsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  ReflectionLimitsFactory(StreamWatchdog* watchdog, int max_open)
      : watchdog_(watchdog), max_open_(max_open) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->method() == nullptr || !absl::StartsWith(info->method(), kReflectionPrefix)) {
      return nullptr;  // Not intercepted.
    }
    return new ReflectionLimits(info, watchdog_, &open_, max_open_);
  }

 private:
  StreamWatchdog* const watchdog_;
  const int max_open_;
  std::atomic<int> open_{0};
};

}  // namespace

int MaxOpenReflectionStreams(int max_threads) { return std::clamp(max_threads / 4, 1, 16); }

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeReflectionLimitsFactory(StreamWatchdog* watchdog, int max_open) {
  return std::make_unique<ReflectionLimitsFactory>(watchdog, max_open);
}

}  // namespace shardopt
