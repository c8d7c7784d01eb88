#include "chromium.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace crosstrain::testing {
namespace {

const char* const kChromium = "/usr/bin/chromium";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

BrowserRun run_chromium(const std::string& url, const std::filesystem::path& work,
                        const std::vector<std::string>& flags, std::chrono::milliseconds deadline) {
  static int runs = 0;
  const std::filesystem::path dir = work / ("chromium-" + std::to_string(runs++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv = {"/bin/sh", "-c", "out=$1; err=$2; shift 2; exec \"$@\" >\"$out\" 2>\"$err\"",
                                   "sh", (dir / "dom.html").string(), (dir / "log.txt").string(), kChromium,
                                   "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                   "--no-first-run", "--enable-logging=stderr", "--v=0",
                                   "--user-data-dir=" + (dir / "profile").string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(url);
  BrowserRun run;
  run.process = run_process(argv, {}, deadline);
  run.dom = read_file(dir / "dom.html");
  run.log = read_file(dir / "log.txt");
  return run;
}

std::string chromium_dom(const std::string& url, const std::filesystem::path& work, const std::string& png) {
  // Test daemons serve HTTPS with certificates of their own.
  std::vector<std::string> flags = {"--virtual-time-budget=4000", "--ignore-certificate-errors"};
  if (png.empty()) flags.push_back("--dump-dom");
  else flags.insert(flags.end(), {"--screenshot=" + png, "--window-size=1300,1300"});
  const BrowserRun run = run_chromium(url, work, flags);
  EXPECT_FALSE(run.process.timed_out) << "chromium did not finish within 90 s on " << url;
  return run.dom;
}

}  // namespace crosstrain::testing
