// A job's live metrics for the service: the tail of its run folder's metrics.jsonl, read from the end so that a
// long run's file (hundreds of thousands of rows) is not read whole on every dashboard poll.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crosstrain/scheduler/service.h"

namespace crosstrain::scheduler {
namespace {

// The last `n` lines of the file at `path` (fewer when it has fewer; none when it cannot be read). A last line
// without its newline is kept: the caller decides whether it is whole.
std::vector<std::string> last_lines(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in || n == 0) return {};
  in.seekg(0, std::ios::end);
  std::streamoff pos = in.tellg();
  std::string tail;
  size_t newlines = 0;
  constexpr std::streamoff kChunk = 1 << 16;
  // n + 1 newlines (one ends the line before the n we want) or the start of the file.
  while (pos > 0 && newlines <= n) {
    const std::streamoff take = std::min(kChunk, pos);
    pos -= take;
    std::string block(static_cast<size_t>(take), '\0');
    in.seekg(pos);
    if (!in.read(block.data(), take)) return {};  // truncated under us (the trainer restarted): try next poll
    newlines += static_cast<size_t>(std::count(block.begin(), block.end(), '\n'));
    tail.insert(0, block);
  }
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t end; (end = tail.find('\n', begin)) != std::string::npos; begin = end + 1)
    lines.push_back(tail.substr(begin, end - begin));
  if (begin < tail.size()) lines.push_back(tail.substr(begin));
  if (pos > 0 && !lines.empty()) lines.erase(lines.begin());  // starts mid-line
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines;
}

}  // namespace

std::string metrics_rows_json(const std::string& path, int64_t since, size_t limit) {
  nlohmann::json rows = nlohmann::json::array();
  // One line more than asked: the last may be torn (the trainer is writing it) and is then skipped.
  for (const std::string& line : last_lines(path, limit + 1)) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) continue;  // torn or not a row
    const auto step = row.find("step");
    if (since >= 0 && (step == row.end() || !step->is_number() || step->get<double>() <= static_cast<double>(since)))
      continue;
    rows.push_back(std::move(row));
  }
  if (rows.size() > limit) rows.erase(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(rows.size() - limit));
  return rows.dump();
}

}  // namespace crosstrain::scheduler
