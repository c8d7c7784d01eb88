// Headless Chromium for the dashboard tests: the DOM of a page after its scripts ran, and a screenshot.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "subprocess.h"

namespace crosstrain::testing {

// Headless Chromium on `url` with a fresh profile: the DOM after the page's scripts ran (stdout to a file, so the
// page cannot pass for a log line), and a screenshot when `png` is given. Killed at its deadline.
inline std::string chromium_dom(const std::string& url, const std::filesystem::path& work, const std::string& png = "") {
  std::filesystem::create_directories(work);
  std::vector<std::string> argv = {"/bin/sh", "-c", "out=$1; shift; exec \"$@\" >\"$out\" 2>/dev/null", "sh",
                                   (work / "dom.html").string(), "/usr/bin/chromium", "--headless=new", "--no-sandbox",
                                   "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                                   "--user-data-dir=" + (work / "profile").string(), "--virtual-time-budget=4000"};
  if (png.empty()) argv.push_back("--dump-dom");
  else argv.insert(argv.end(), {"--screenshot=" + png, "--window-size=1300,1300"});
  argv.push_back(url);
  const auto r = run_process(argv, {}, std::chrono::milliseconds(90000));
  EXPECT_FALSE(r.timed_out) << "chromium did not finish within 90 s on " << url;
  std::ifstream in(work / "dom.html");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace crosstrain::testing
