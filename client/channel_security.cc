#include "client/channel_security.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/auth_metadata.h"
#include "common/file.h"
#include "common/secret_files.h"

namespace shardopt {
namespace {

// Adds the bearer token to each call's initial metadata. An interceptor and
// not call credentials: gRPC sends call credentials only over TLS, and a
// token on a plaintext channel (a private network) is the server's choice.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kAuthorizationMetadataKey, *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;
};

class BearerTokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token) : value_(BearerMetadataValue(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&value_);
  }

 private:
  const std::string value_;  // Lives as long as the channel holds the factory.
};

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFileToString(FileEnv::Default(), path);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(), absl::StrCat(flag, ": ", pem.status().message()));
  }
  return pem;
}

}  // namespace

ChannelFactory::ChannelFactory() : credentials_(grpc::InsecureChannelCredentials()) {}

absl::StatusOr<ChannelFactory> ChannelFactory::Create(const ChannelSecurity& security) {
  ChannelFactory factory;
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its key, and the key its certificate");
  }
  if (!security.tls_cert_file.empty() && security.tls_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs TLS: give the CA of the servers' certificates too");
  }
  if (!security.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions tls;
    absl::StatusOr<std::string> ca = ReadPem("TLS CA file", security.tls_ca_file);
    if (!ca.ok()) return ca.status();
    tls.pem_root_certs = *std::move(ca);
    if (!security.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadPem("TLS certificate file", security.tls_cert_file);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem("TLS key file", security.tls_key_file);
      if (!key.ok()) return key.status();
      WarnIfSecretReadableByOthers(FileEnv::Default(), "TLS key file", security.tls_key_file);
      tls.pem_cert_chain = *std::move(cert);
      tls.pem_private_key = *std::move(key);
    }
    factory.credentials_ = grpc::SslCredentials(tls);
    factory.tls_ = true;
    factory.server_name_ = security.tls_server_name;
  }
  factory.auth_token_ = security.auth_token;
  if (!security.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadFileToString(FileEnv::Default(), security.auth_token_file);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat("token file: ", token.status().message()));
    }
    WarnIfSecretReadableByOthers(FileEnv::Default(), "token file", security.auth_token_file);
    factory.auth_token_ = std::string(absl::StripAsciiWhitespace(*token));
    if (factory.auth_token_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file '", security.auth_token_file, "' is empty"));
    }
  }
  return factory;
}

std::shared_ptr<grpc::Channel> ChannelFactory::NewChannel(const std::string& address,
                                                          grpc::ChannelArguments args) const {
  if (!server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!auth_token_.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(auth_token_));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials_, args,
                                                                 std::move(interceptors));
}

}  // namespace shardopt
