// The command-line flags of a trainer program for how it reaches secured
// shard servers (--tls_ca_file, --tls_cert_file, --tls_key_file,
// --tls_server_name, --auth_token_file), defined once for every program
// that links this library (the trainers, shardoptctl).
#ifndef SHARDOPT_CLIENT_SECURITY_FLAGS_H_
#define SHARDOPT_CLIENT_SECURITY_FLAGS_H_

#include "client/channel_security.h"

namespace shardopt {

// The flags' values, after absl::ParseCommandLine.
ChannelSecurity ChannelSecurityFromFlags();

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SECURITY_FLAGS_H_
