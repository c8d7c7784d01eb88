// The command lines of README.md and docs/*.md, as a reader copies them: every `crosstrain train` line (also under
// `crosstrain run ... --`) is checked as `crosstrain config` checks a run, with its recipe, its --set overrides and
// its rank count, so a renamed key, a recipe that moved or a layout that no longer resolves turns this red; and
// every line of a tiny recipe trains 2 steps as written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "cli_fixture.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

struct CommandLine {
  std::string where;  // "README.md:40"
  std::vector<std::string> words;
};

// Splits a line as a POSIX shell would for these examples: quotes group words and are removed, a backslash takes
// the next character, an unquoted # starts a comment.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
      else word += c;
    } else if (c == '\'' || c == '"') {
      quote = c, in_word = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i], in_word = true;
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(word);
      word.clear(), in_word = false;
    } else {
      word += c, in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// The lines of the fenced code blocks of a Markdown file that start with crosstrain (or build/crosstrain, or a
// "$ " prompt before it), continuation lines joined.
std::vector<CommandLine> commands_of(const fs::path& file) {
  std::vector<CommandLine> out;
  std::ifstream in(file);
  bool in_code = false;
  int number = 0;
  std::string pending;
  int pending_line = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      in_code = !in_code;
      continue;
    }
    if (!in_code) continue;
    if (!pending.empty()) {
      pending += " " + line;
    } else {
      std::string text = line.rfind("$ ", 0) == 0 ? line.substr(2) : line;
      if (text.rfind("build/crosstrain ", 0) != 0 && text.rfind("crosstrain ", 0) != 0) continue;
      pending = text, pending_line = number;
    }
    // A trailing backslash (before any comment) continues the command on the next line.
    const std::string code = pending.substr(0, pending.find(" #"));
    const auto last = code.find_last_not_of(' ');
    if (last != std::string::npos && code[last] == '\\') {
      pending = code.substr(0, last);
      continue;
    }
    out.push_back({file.filename().string() + ":" + std::to_string(pending_line), shell_words(pending)});
    pending.clear();
  }
  return out;
}

std::vector<CommandLine> documented_commands() {
  std::vector<CommandLine> all = commands_of(fs::path(CT_SOURCE_DIR) / "README.md");
  for (const auto& entry : fs::directory_iterator(fs::path(CT_SOURCE_DIR) / "docs")) {
    if (entry.path().extension() != ".md") continue;
    auto more = commands_of(entry.path());
    all.insert(all.end(), more.begin(), more.end());
  }
  return all;
}

// A scratch name of this process: ctest runs this file's tests as processes side by side, and one must not
// remove what the other is reading.
std::string own_name(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

bool is_crosstrain(const std::string& word) { return word == "crosstrain" || word == "build/crosstrain"; }

// The token file `make tokens` writes into the checkout (data/fortunes-sp, for the SentencePiece recipes), made once
// in a scratch folder instead: the checks must not depend on what an earlier command left in the tree.
const std::string& sentencepiece_tokens() {
  static const std::string file = [] {
    const std::string out = fresh_dir(own_name("documented-fortunes-sp"));
    const auto made = run_process({kBin, "tokenize", "/usr/share/games/fortunes", "--out", out, "--vocab-size", "2048"},
                                  {}, milliseconds(120000));
    EXPECT_EQ(made.exit_code(), 0) << made.output;
    return out + "/train.bin";
  }();
  return file;
}

// `args` run from the checkout's root, as the docs' relative paths (recipes/, data/) expect.
ProcessResult run_in_checkout(const std::vector<std::string>& args, milliseconds timeout) {
  std::vector<std::string> shell{"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", CT_SOURCE_DIR};
  shell.insert(shell.end(), args.begin(), args.end());
  return run_process(shell, {}, timeout);
}

// `crosstrain config` arguments for a documented `crosstrain train` line (directly or after `crosstrain run ... --`):
// the recipe, every --set and the rank count; empty when the line trains nothing or is a template ("RECIPE").
std::vector<std::string> as_config_check(const std::vector<std::string>& words) {
  size_t at = 0;
  std::string nproc;
  if (words.size() > 2 && words[1] == "run") {  // the launcher's --nproc, then its command after "--"
    for (at = 2; at < words.size() && words[at] != "--"; ++at)
      if (words[at] == "--nproc" && at + 1 < words.size()) nproc = words[at + 1];
    ++at;
  }
  if (at + 2 >= words.size() || !is_crosstrain(words[at]) || words[at + 1] != "train") return {};
  const std::string recipe = words[at + 2];
  if (recipe.find(".toml") == std::string::npos || recipe.find("...") != std::string::npos) return {};
  std::vector<std::string> args{kBin, "config", recipe};
  std::ifstream text(fs::path(CT_SOURCE_DIR) / recipe);
  const std::string recipe_text((std::istreambuf_iterator<char>(text)), std::istreambuf_iterator<char>());
  if (recipe_text.find("data/fortunes-sp/train.bin") != std::string::npos)
    args.insert(args.end(), {"--set", "data.path=" + sentencepiece_tokens()});
  for (size_t i = at + 3; i + 1 < words.size(); ++i) {
    if (words[i] == "--set") args.insert(args.end(), {"--set", words[++i]});
    else if (words[i] == "--nproc") nproc = words[++i];
  }
  if (!nproc.empty()) args.insert(args.end(), {"--nproc", nproc});
  return args;
}

}  // namespace

TEST(DocumentedCommands, TheExtractorReadsShellLinesAsAShellDoes) {
  EXPECT_EQ(shell_words("build/crosstrain plan a --layout \"tp=8 pp=16\" --set 'x=\"3,1\"'   # a comment"),
            (std::vector<std::string>{"build/crosstrain", "plan", "a", "--layout", "tp=8 pp=16", "--set", "x=\"3,1\""}));
  EXPECT_EQ(shell_words("a\\ b c#d"), (std::vector<std::string>{"a b", "c#d"}));
  const auto check = as_config_check(shell_words(
      "build/crosstrain run --nproc 4 -- build/crosstrain train recipes/gpt-small.toml --set train.steps=3 --resume"));
  EXPECT_EQ(check, (std::vector<std::string>{kBin, "config", "recipes/gpt-small.toml", "--set", "train.steps=3", "--nproc",
                                             "4"}));
  EXPECT_TRUE(as_config_check(shell_words("crosstrain train RECIPE --nproc 2")).empty());
}

TEST(DocumentedCommands, EveryTrainLineOfTheReadmeAndDocsIsAValidRun) {
  int checked = 0, readme = 0;
  for (const CommandLine& line : documented_commands()) {
    const std::vector<std::string> args = as_config_check(line.words);
    if (args.empty()) continue;
    ++checked;
    readme += line.where.rfind("README.md:", 0) == 0;
    const auto res = run_in_checkout(args, milliseconds(60000));
    std::string shown;
    for (const auto& w : line.words) shown += w + " ";
    EXPECT_EQ(res.exit_code(), 0) << line.where << ": " << shown << "\n" << res.output;
  }
  std::printf("checked %d documented train lines, %d of them in the README\n", checked, readme);
  // The README alone shows a few dozen; fewer means the extraction broke, not that the docs are right.
  EXPECT_GE(readme, 20);
  EXPECT_GE(checked, 40);
}

// What a documented fine-tuning line starts from (the docs train it first): gpt-tiny as its recipe has it, 2 steps,
// made once in a scratch folder.
const std::string& pretrained_run() {
  static const std::string dir = [] {
    const std::string out = fresh_dir(own_name("documented-pretrained"));
    const auto made = run_in_checkout({kBin, "train", "recipes/gpt-tiny.toml", "--set", "run.dir=" + out, "--set",
                                       "train.steps=2", "--set", "train.eval_every=0", "--set", "train.sample_tokens=0",
                                       "--set", "train.peak_flops_per_rank=1e9"},
                                      milliseconds(300000));
    EXPECT_EQ(made.exit_code(), 0) << made.output;
    return out;
  }();
  return dir;
}

// Every documented line of a tiny recipe trains 2 steps as written (37 lines, about 90 s on 2 cores), in a scratch run folder,
// with the line's own ranks and overrides; a fine-tuning line (model.init_from, on the line or in its recipe) starts
// from pretrained_run(). Lines that continue their own earlier run (--resume) or need a file the reader makes first
// (run.secret_file) are checked above only.
TEST(DocumentedCommands, EveryTinyRecipeLineTrainsTwoSteps) {
  int ran = 0;
  for (const CommandLine& line : documented_commands()) {
    std::vector<std::string> args = as_config_check(line.words);
    if (args.size() < 3 || args[2].find("-tiny") == std::string::npos) continue;
    std::string shown;
    bool needs_more = false, fine_tunes = false;
    for (const auto& w : line.words) {
      shown += w + " ";
      needs_more = needs_more || w == "--resume" || w.rfind("run.secret_file=", 0) == 0;
      fine_tunes = fine_tunes || w.rfind("model.init_from=", 0) == 0;
    }
    if (needs_more) continue;
    std::ifstream recipe(fs::path(CT_SOURCE_DIR) / args[2]);
    const std::string text((std::istreambuf_iterator<char>(recipe)), std::istreambuf_iterator<char>());
    fine_tunes = fine_tunes || std::regex_search(text, std::regex("\ninit_from = \"[^\"]+\""));
    args[1] = "train";
    const std::string dir = fresh_dir(own_name("documented-" + std::to_string(++ran)));
    args.insert(args.end(), {"--set", "run.dir=" + dir, "--set", "train.steps=2", "--set", "train.eval_every=0",
                             "--set", "train.sample_tokens=0", "--set", "train.peak_flops_per_rank=1e9"});
    if (fine_tunes) args.insert(args.end(), {"--set", "model.init_from=" + pretrained_run()});
    const auto res = run_in_checkout(args, milliseconds(300000));
    EXPECT_EQ(res.exit_code(), 0) << line.where << ": " << shown << "\n" << res.output;
  }
  std::printf("trained %d documented lines for 2 steps each\n", ran);
  EXPECT_GE(ran, 10);
}
