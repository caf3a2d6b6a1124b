#include "client/security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA of the shard servers' certificates: connect with TLS (plaintext without).");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate, for mutual TLS.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check in the servers' certificates instead of the dialled host.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding this trainer's bearer token, sent with every call.");

namespace shardopt {

ChannelSecurity ChannelSecurityFromFlags() {
  ChannelSecurity security;
  security.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  security.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  security.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  return security;
}

}  // namespace shardopt
