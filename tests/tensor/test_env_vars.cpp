// kiln's environment variables (kiln/tensor/env_vars.h): every spelling of a switch each way, counts, the default where
// a value is missing or not understood, and the one warning that names a value it does not understand.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kiln/tensor/env_vars.h"

namespace kiln {
namespace {

TEST(EnvVars, ParsesEverySpellingEachWayAndNothingElse) {
  for (const char* on : {"1", "true", "TRUE", "True", "on", "ON", "yes", "Yes"}) {
    ASSERT_TRUE(parse_flag(on).has_value()) << on;
    EXPECT_TRUE(*parse_flag(on)) << on;
  }
  for (const char* off : {"0", "false", "FALSE", "off", "Off", "no", "NO"}) {
    ASSERT_TRUE(parse_flag(off).has_value()) << off;
    EXPECT_FALSE(*parse_flag(off)) << off;
  }
  for (const char* other : {"", " ", "2", "-1", "of", "onn", "y", "n", "enable", "1 ", " 0", "truee"}) {
    EXPECT_FALSE(parse_flag(other).has_value()) << "'" << other << "'";
  }
}

TEST(EnvVars, ReadsTheEnvironmentAndKeepsTheDefaultWhereItSaysNothing) {
  const char* name = "KILN_TEST_ENV_FLAG_SWITCH";
  ::unsetenv(name);
  EXPECT_TRUE(env_flag(name, true));
  EXPECT_FALSE(env_flag(name, false));
  ::setenv(name, "", 1);
  EXPECT_TRUE(env_flag(name, true));
  EXPECT_FALSE(env_flag(name, false));
  ::setenv(name, "off", 1);
  EXPECT_FALSE(env_flag(name, true));
  ::setenv(name, "Yes", 1);
  EXPECT_TRUE(env_flag(name, false));
  ::unsetenv(name);
}

TEST(EnvVars, AValueItDoesNotUnderstandKeepsTheDefaultAndSaysSoOnce) {
  const char* name = "KILN_TEST_ENV_FLAG_MISTYPED";
  ::setenv(name, "fasle", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(env_flag(name, true));
  EXPECT_TRUE(env_flag(name, true));  // the same value again: no second warning
  const std::string said = ::testing::internal::GetCapturedStderr();
  for (const char* part :
       {"KILN_TEST_ENV_FLAG_MISTYPED", "\"fasle\"", "stays on", "0, false, off or no", "not understood"}) {
    EXPECT_NE(said.find(part), std::string::npos) << "missing '" << part << "' in: " << said;
  }
  EXPECT_EQ(said.find("KILN_TEST_ENV_FLAG_MISTYPED"), said.rfind("KILN_TEST_ENV_FLAG_MISTYPED")) << said;
  ::setenv(name, "2", 1);  // another value: another warning, and the other default
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(env_flag(name, false));
  const std::string again = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(again.find("\"2\""), std::string::npos) << again;
  EXPECT_NE(again.find("stays off"), std::string::npos) << again;
  ::unsetenv(name);
}

TEST(EnvVars, ParsesCountsAndNothingElse) {
  EXPECT_EQ(parse_positive_int("1"), 1);
  EXPECT_EQ(parse_positive_int("8"), 8);
  EXPECT_EQ(parse_positive_int("0016"), 16);
  EXPECT_EQ(parse_positive_int("2147483647"), 2147483647);
  for (const char* other :
       {"", "0", "00", "-4", "+4", " 4", "4 ", "4x", "x4", "4.0", "1e3", "2147483648", "99999999999", "four"}) {
    EXPECT_FALSE(parse_positive_int(other).has_value()) << "'" << other << "'";
  }
}

TEST(EnvVars, ACountItDoesNotUnderstandKeepsTheDefaultAndSaysSo) {
  const char* name = "KILN_TEST_ENV_COUNT";
  ::unsetenv(name);
  EXPECT_EQ(env_positive_int(name, 6), 6);
  ::setenv(name, "12", 1);
  EXPECT_EQ(env_positive_int(name, 6), 12);
  ::setenv(name, "4x", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(env_positive_int(name, 6), 6);
  const std::string said = ::testing::internal::GetCapturedStderr();
  for (const char* part :
       {"KILN_TEST_ENV_COUNT", "\"4x\"", "the default, 6, is used", "a whole number of at least 1"}) {
    EXPECT_NE(said.find(part), std::string::npos) << "missing '" << part << "' in: " << said;
  }
  ::unsetenv(name);
}

}  // namespace
}  // namespace kiln
