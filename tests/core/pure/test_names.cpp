// The one grammar for names others give crosstrain, and shell quoting.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"

using crosstrain::check_name;
using crosstrain::is_valid_name;
using crosstrain::shell_quote;

TEST(Names, LettersDigitsDotsUnderscoresAndDashesStartingWithALetterOrDigit) {
  for (const char* ok : {"east", "us-west-2", "a", "0", "job_7.a1", "Cluster.B"}) EXPECT_TRUE(is_valid_name(ok)) << ok;
  const std::vector<std::string> bad_names = {"", "-x", ".hidden", "_x", "a b", "a/b", "../x", "x;id", "x$(id)",
                                             "a\nb", "é", std::string(65, 'a'), std::string("a\0b", 3)};
  for (const std::string& bad : bad_names)
    EXPECT_FALSE(is_valid_name(bad)) << bad;
  EXPECT_TRUE(is_valid_name(std::string(64, 'a')));
}

TEST(Names, ARefusalSaysWhatAndTheRuleWithTheTextMadePrintable) {
  try {
    check_name("cluster name", std::string("x\x01;") + std::string(100, 'y'));
    FAIL() << "a bad name passed";
  } catch (const crosstrain::UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cluster name 'x\\x01;yyy"), std::string::npos) << m;
    EXPECT_NE(m.find("...'"), std::string::npos) << m;  // cut at 64 characters
    EXPECT_NE(m.find("1 to 64 letters, digits"), std::string::npos) << m;
  }
}

TEST(Names, ShellQuotingKeepsEveryCharacterLiteral) {
  EXPECT_EQ(shell_quote("plain"), "'plain'");
  EXPECT_EQ(shell_quote("a b$(id);`x`"), "'a b$(id);`x`'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

// Files that a manifest or an index names lie beside it: plain names only (issue 34).
TEST(Names, FileNamesFromOthersMustStayInTheirDirectory) {
  for (const char* ok : {"rank-00000.safetensors", "model-00001-of-00002.safetensors", "a..b", ".hidden"})
    EXPECT_EQ(crosstrain::file_name_error(ok), "") << ok;
  for (const char* bad : {"", ".", "..", "../x", "/etc/passwd", "sub/x", "a\\b"})
    EXPECT_NE(crosstrain::file_name_error(bad), "") << bad;
  EXPECT_NE(crosstrain::file_name_error(std::string("a\0b", 3)), "");
  EXPECT_NE(crosstrain::file_name_error(std::string(256, 'a')), "");
}
