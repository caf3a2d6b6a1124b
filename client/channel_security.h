// How a trainer or a tool reaches a shard server: plaintext (the default,
// for loopback) or TLS, optionally with a client certificate (mutual TLS),
// and optionally with a bearer token sent with every call
// (common/auth_metadata.h). Used by TrainerClient, shardoptctl, the Python
// binding and the tests, so that all of them speak to a secured server alike.
#ifndef SHARDOPT_CLIENT_CHANNEL_SECURITY_H_
#define SHARDOPT_CLIENT_CHANNEL_SECURITY_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shardopt {

struct ChannelSecurity {
  // PEM CA certificates that signed the servers' certificates: TLS instead
  // of plaintext. Empty: plaintext.
  std::string tls_ca_file;
  // PEM client certificate and its key, for servers that require one
  // (--tls_client_ca_file). Need tls_ca_file.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Checked against the server certificate instead of the dialled host
  // (a certificate issued for a DNS name, dialled by IP address).
  std::string tls_server_name;
  // Sent as `authorization: Bearer <token>` with every call; empty: none.
  std::string auth_token;
  // Or read from this file (surrounding whitespace dropped), if set.
  std::string auth_token_file;
};

// The security's files read and checked once; then makes channels.
class ChannelFactory {
 public:
  // Plaintext, no token.
  ChannelFactory();
  // NOT_FOUND / PERMISSION_DENIED naming an unreadable file;
  // INVALID_ARGUMENT for a client certificate without TLS, a certificate
  // without its key, or an empty token file.
  static absl::StatusOr<ChannelFactory> Create(const ChannelSecurity& security);

  bool tls() const { return tls_; }
  // A channel to `address` with `args` (the server name override added)
  // that sends the token with every call.
  std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                            grpc::ChannelArguments args) const;

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::string auth_token_;
  std::string server_name_;
  bool tls_ = false;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_CHANNEL_SECURITY_H_
