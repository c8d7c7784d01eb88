// What several ranks print alike is printed once, with the ranks it came from. A bad config or a missing file
// makes every rank fail the same way; N copies of the line hide whether any rank said something else.
//
// The launcher offers each line of a rank's stderr. Lines of crosstrain itself ("crosstrain: ...", "crosstrain
// elastic: ..."), which ranks print alike, are held for a moment; the same text from other ranks joins them, and
// when the moment is over, or every rank has sent it, the line is printed once: "[ranks 0-3] crosstrain: ...".
// Everything else (a program's own output, the progress) passes at once with its rank. Pure logic, no I/O.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace crosstrain::apps {

// "0-3", "0,2,5-7": sorted ranks with runs joined.
std::string rank_list(std::vector<int> ranks);

class LineFolder {
 public:
  using Clock = std::chrono::steady_clock;
  // `hold`: how long a line waits for its copies; `ranks`: how many ranks can send one (all sent it: no wait).
  LineFolder(std::chrono::milliseconds hold, int ranks);

  // The lines to print now for `line` of `rank` (none when it is held to be folded).
  std::vector<std::string> offer(int rank, const std::string& line, Clock::time_point now);
  // Held lines whose moment is over, folded, in the order they were first seen.
  std::vector<std::string> due(Clock::time_point now);
  // Every held line (the launcher is about to return).
  std::vector<std::string> flush();

 private:
  struct Held {
    std::string text;
    std::vector<int> ranks;
    Clock::time_point since;
  };
  static std::string folded(const Held& h);
  static constexpr size_t kMaxHeld = 256;  // lines held at once (each waits at most `hold`)

  std::chrono::milliseconds hold_;
  int ranks_;
  std::vector<Held> held_;
};

}  // namespace crosstrain::apps
