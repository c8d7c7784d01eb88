#include "line_folder.h"

#include <algorithm>

namespace crosstrain::apps {

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

LineFolder::LineFolder(std::chrono::milliseconds hold, int ranks) : hold_(hold), ranks_(ranks) {}

std::string LineFolder::folded(const Held& h) {
  return (h.ranks.size() == 1 ? "[rank " : "[ranks ") + rank_list(h.ranks) + "] " + h.text;
}

std::vector<std::string> LineFolder::offer(int rank, const std::string& line, Clock::time_point now) {
  if (line.rfind("crosstrain", 0) != 0) return {"[rank " + std::to_string(rank) + "] " + line};
  auto same = std::find_if(held_.begin(), held_.end(), [&](const Held& h) {
    return h.text == line && std::find(h.ranks.begin(), h.ranks.end(), rank) == h.ranks.end();
  });
  std::vector<std::string> out;
  if (same == held_.end()) {
    // A rank that floods its own lines must not grow the held set (or the search through it) without end: past
    // kMaxHeld the oldest goes out as it is.
    if (held_.size() >= kMaxHeld) {
      out.push_back(folded(held_.front()));
      held_.erase(held_.begin());
    }
    held_.push_back(Held{line, {rank}, now});
    same = held_.end() - 1;
  } else {
    same->ranks.push_back(rank);
  }
  if (static_cast<int>(same->ranks.size()) < ranks_) return out;
  out.push_back(folded(*same));
  held_.erase(same);
  return out;
}

std::vector<std::string> LineFolder::due(Clock::time_point now) {
  std::vector<std::string> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->since < hold_) {
      ++it;
      continue;
    }
    out.push_back(folded(*it));
    it = held_.erase(it);
  }
  return out;
}

std::vector<std::string> LineFolder::flush() {
  std::vector<std::string> out;
  for (const auto& h : held_) out.push_back(folded(h));
  held_.clear();
  return out;
}

}  // namespace crosstrain::apps
