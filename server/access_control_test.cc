#include "server/access_control.h"

#include <string>

#include "common/auth_metadata.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

constexpr char kTrainerToken[] = "trainer-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";

AccessControl Tokens() {
  return AccessControl::FromTokenFileContents(absl::StrCat("# tokens of the test job\n\ntrainer ",
                                                           kTrainerToken, "\nreadonly\t",
                                                           kReaderToken, "   # dashboards\n"))
      .value();
}

TEST(AccessControlTest, WithoutTokensEverythingIsAllowed) {
  AccessControl open;
  EXPECT_FALSE(open.enabled());
  EXPECT_TRUE(open.Check(std::nullopt, Access::kWrite).ok());
}

TEST(AccessControlTest, TrainerTokenMayWriteAndRead) {
  const AccessControl control = Tokens();
  const std::string bearer = BearerMetadataValue(kTrainerToken);
  EXPECT_TRUE(control.Check(bearer, Access::kWrite).ok());
  EXPECT_TRUE(control.Check(bearer, Access::kRead).ok());
  // The scheme is case-insensitive, as HTTP's is.
  EXPECT_TRUE(control.Check(absl::StrCat("bearer ", kTrainerToken), Access::kWrite).ok());
}

TEST(AccessControlTest, ReadOnlyTokenMayOnlyRead) {
  const AccessControl control = Tokens();
  const std::string bearer = BearerMetadataValue(kReaderToken);
  EXPECT_TRUE(control.Check(bearer, Access::kRead).ok());
  const absl::Status write = control.Check(bearer, Access::kWrite);
  EXPECT_EQ(write.code(), absl::StatusCode::kPermissionDenied) << write;
  EXPECT_NE(write.message().find("read-only"), absl::string_view::npos) << write;
}

TEST(AccessControlTest, MissingMalformedOrUnknownTokensAreUnauthenticated) {
  const AccessControl control = Tokens();
  for (const std::optional<std::string>& value :
       {std::optional<std::string>(), std::optional<std::string>(kTrainerToken),
        std::optional<std::string>("Basic dXNlcjpwYXNz"),
        std::optional<std::string>(BearerMetadataValue("trainer-token-012345678")),
        std::optional<std::string>(BearerMetadataValue(std::string(kTrainerToken) + "9")),
        std::optional<std::string>(BearerMetadataValue(""))}) {
    for (Access access : {Access::kRead, Access::kWrite}) {
      const absl::Status s =
          control.Check(value ? std::optional<absl::string_view>(*value) : std::nullopt, access);
      EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << (value ? *value : "(none)");
    }
  }
}

TEST(AccessControlTest, AHashInsideATokenIsPartOfIt) {
  const AccessControl control =
      AccessControl::FromTokenFileContents("trainer abcdefghijklmnop#rest # a comment\n#x\n")
          .value();
  EXPECT_TRUE(control.Check(BearerMetadataValue("abcdefghijklmnop#rest"), Access::kWrite).ok());
  EXPECT_EQ(control.Check(BearerMetadataValue("abcdefghijklmnop"), Access::kWrite).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AccessControlTest, BadTokenFilesAreRefusedWithoutEchoingTokens) {
  for (const std::string& contents :
       {std::string(""), std::string("# only a comment\n"),
        std::string("admin secret-secret-secret\n"), std::string("trainer short\n"),
        std::string("trainer two words-words-words x\n"), std::string("trainer\n")}) {
    absl::StatusOr<AccessControl> control = AccessControl::FromTokenFileContents(contents);
    ASSERT_FALSE(control.ok()) << contents;
    EXPECT_EQ(control.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(control.status().message().find("secret"), absl::string_view::npos);
  }
  absl::StatusOr<AccessControl> third_line =
      AccessControl::FromTokenFileContents("trainer aaaaaaaaaaaaaaaaaaaa\n\nreadonly bad token\n");
  ASSERT_FALSE(third_line.ok());
  EXPECT_NE(third_line.status().message().find("line 3"), absl::string_view::npos)
      << third_line.status();
}

}  // namespace
}  // namespace shardopt
