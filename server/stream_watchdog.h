// StreamWatchdog: cancels client-streaming calls that stop sending.
//
// A push or register stream holds state while it is open (a trainer's staging
// slot, a memory reservation). A client that opens one and then stalls
// without a deadline (a hung process, grpcurl left open) would hold it for as
// long as its connection lives, blocking that trainer's retries. Handlers
// register each stream with Watch() and Touch() it after every message; a
// background thread TryCancel()s streams idle for longer than the timeout, so
// their blocked Read() returns and the handler releases what it held. A
// handler Stop()s the watch once it reads no more of the stream: its own
// waits after that are no stall of the client's.
#ifndef SHARDOPT_SERVER_STREAM_WATCHDOG_H_
#define SHARDOPT_SERVER_STREAM_WATCHDOG_H_

#include <grpcpp/server_context.h>

#include <cstdint>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardopt {

class StreamWatchdog {
 public:
  // A zero or negative timeout disables the watchdog.
  explicit StreamWatchdog(absl::Duration idle_timeout);
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches one stream from construction to destruction.
  class Watch {
   public:
    Watch(StreamWatchdog* watchdog, grpc::ServerContextBase* context);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // Records activity: a message arrived.
    void Touch();
    // Ends the watch early: the handler reads no more of the stream, and
    // what it does next (a push waiting to be applied behind a checkpoint or
    // a slow trainer, a restore) waits on the server's own progress, or on
    // the call's deadline where it takes one, not on the client's sending.
    void Stop();

   private:
    StreamWatchdog* const watchdog_;
    uint64_t id_ = 0;
  };

 private:
  struct Entry {
    grpc::ServerContextBase* context;
    absl::Time last_activity;
  };

  void Loop();

  const absl::Duration idle_timeout_;
  absl::Mutex mu_;
  std::map<uint64_t, Entry> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_STREAM_WATCHDOG_H_
