// Headless Chromium for the tests of pages (the run report, the scheduler's dashboard): one driver, with a fresh
// profile per run and a deadline that kills its whole process group, so a page can never hang a test.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "subprocess.h"

namespace crosstrain::testing {

struct BrowserRun {
  std::string dom, log;  // stdout (the DOM with --dump-dom), stderr (its log, console messages included)
  ProcessResult process;
};

// Chromium on `url` (an http:// or file:// address) with `flags` added, in a new directory under `work`; stdout
// and stderr go to files, so the page's own text cannot pass for a log line.
BrowserRun run_chromium(const std::string& url, const std::filesystem::path& work,
                        const std::vector<std::string>& flags,
                        std::chrono::milliseconds deadline = std::chrono::milliseconds(90000));

// The DOM of `url` after its scripts ran (a few seconds of virtual time), or a screenshot into `png` when given;
// a test expectation fails when Chromium does not finish in time.
std::string chromium_dom(const std::string& url, const std::filesystem::path& work, const std::string& png = "");

}  // namespace crosstrain::testing
