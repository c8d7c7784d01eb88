// Spot checks of the ledger's claims (ledger/ledger.h): the work each entry claims against its job's
// figures, steps claimed twice, and sampled steps' gradient digests against a recomputation.
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <set>

#include "crosstrain/ledger/ledger.h"
#include "internal.h"

namespace crosstrain::scheduler {
using namespace ledger_detail;

namespace {

constexpr char kSampleDomain[] = "crosstrain-spot/1";

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

bool off_by_more_than(double claimed, double expected, double tolerance) {
  return std::abs(claimed - expected) > tolerance * std::max(std::abs(expected), 1.0);
}

// Claimed tokens and FLOPs against what the job's steps amount to.
void check_work(const LedgerEntry& e, const SpotCheckOptions& options, SpotCheckReport& report) {
  const auto job = options.jobs.find(e.job);
  if (job == options.jobs.end()) return;
  const JobWork& w = job->second;
  auto flag = [&](const std::string& why) { report.flags.push_back({e.cluster, e.seq, why}); };
  const double claimed = static_cast<double>(e.tokens), steps_tokens = static_cast<double>(e.steps) * w.tokens_per_step;
  // Shared steps: a cluster's share of a step is at most the whole step.
  const bool wrong = w.shared_steps ? claimed > steps_tokens + options.tolerance * std::max(steps_tokens, 1.0)
                                    : off_by_more_than(claimed, steps_tokens, options.tolerance);
  if (w.tokens_per_step > 0 && wrong)
    flag("claims " + std::to_string(e.tokens) + " tokens for " + std::to_string(e.steps) + " steps; job '" + e.job +
         "' has " + std::to_string(w.tokens_per_step) + " tokens a step, so " + (w.shared_steps ? "at most " : "") +
         fmt(steps_tokens));
  const double tokens = w.tokens_per_step > 0 && !w.shared_steps ? steps_tokens : claimed;
  const double flops = tokens * w.flops_per_token;
  if (w.flops_per_token > 0 && off_by_more_than(e.flops, flops, options.tolerance))
    flag("claims " + fmt(e.flops) + " FLOPs; " + fmt(tokens) + " tokens of job '" + e.job + "' are " + fmt(flops));
}

// Steps of a job already claimed, as ranges [first, last] with who claimed them.
struct Claim {
  int64_t last;
  std::string cluster;
  int64_t seq;
};
using Claims = std::map<int64_t, Claim>;

void check_double_claims(const LedgerEntry& e, Claims& claims, SpotCheckReport& report) {
  if (e.steps <= 0) return;
  const int64_t first = e.first_step, last = e.first_step + e.steps - 1;
  // Recorded ranges are disjoint, so their ends grow with their starts: walk back from the last range starting at
  // or before `last` to the earliest one that still reaches `first`.
  auto it = claims.upper_bound(last);
  auto overlapping = claims.end();
  while (it != claims.begin() && std::prev(it)->second.last >= first) overlapping = --it;
  if (overlapping != claims.end()) {
    const int64_t overlap = std::max(first, overlapping->first);
    report.flags.push_back({e.cluster, e.seq,
                            "claims step " + std::to_string(overlap) + " of job '" + e.job +
                                "', already claimed by cluster '" + overlapping->second.cluster + "' (seq " +
                                std::to_string(overlapping->second.seq) + ")"});
    return;  // not recorded: the first claim keeps the range
  }
  claims[first] = {last, e.cluster, e.seq};
}

// Shared steps: the tokens claimed for each step of a job so far, piecewise constant: a level holds from its key to
// the next key (before the first key: nothing claimed), with who claimed it.
struct Level {
  double tokens = 0;
  std::string who;  // "east (seq 1), west (seq 2)"
};
using Levels = std::map<int64_t, Level>;

// Makes `at` a key, keeping the level that holds there.
Levels::iterator split_at(Levels& levels, int64_t at) {
  auto next = levels.upper_bound(at);
  if (next == levels.begin()) return levels.emplace_hint(next, at, Level{});
  auto prev = std::prev(next);
  if (prev->first == at) return prev;
  return levels.emplace_hint(next, at, prev->second);
}

// A cluster claiming a step twice is flagged like an exclusive double claim (over its own claims); several
// clusters may share a step while their tokens for it stay within the job's tokens a step.
void check_shared_claims(const LedgerEntry& e, const JobWork* w, double tolerance, Claims& own, Levels& levels,
                         SpotCheckReport& report) {
  const size_t flags_before = report.flags.size();
  check_double_claims(e, own, report);
  if (report.flags.size() > flags_before || !w || w->tokens_per_step <= 0 || e.steps <= 0) return;
  const double per_step = static_cast<double>(e.tokens) / static_cast<double>(e.steps);
  const double limit = w->tokens_per_step + tolerance * std::max<double>(w->tokens_per_step, 1.0);
  const auto first = split_at(levels, e.first_step);
  const auto end = split_at(levels, e.first_step + e.steps);
  for (auto it = first; it != end; ++it) {
    if (it->second.tokens + per_step <= limit) continue;
    report.flags.push_back({e.cluster, e.seq,
                            "claims " + fmt(per_step) + " tokens a step for steps " + std::to_string(e.first_step) +
                                "-" + std::to_string(e.first_step + e.steps - 1) + " of job '" + e.job + "'; with the " +
                                fmt(it->second.tokens) + " that " + it->second.who + " claimed for step " +
                                std::to_string(std::max(it->first, e.first_step)) + " that exceeds the job's " +
                                std::to_string(w->tokens_per_step) + " tokens a step"});
    return;  // not recorded: the earlier claims keep the step
  }
  const std::string me = e.cluster + " (seq " + std::to_string(e.seq) + ")";
  for (auto it = first; it != end; ++it) {
    it->second.tokens += per_step;
    it->second.who += (it->second.who.empty() ? "" : ", ") + me;
  }
}

void check_digests(const LedgerEntry& e, const SpotCheckOptions& options, const RecomputeShare& recompute,
                   SpotCheckReport& report) {
  for (const auto& [step, digest] : e.gradient_digests)
    if (step < e.first_step || step >= e.first_step + e.steps) {
      report.flags.push_back({e.cluster, e.seq, "reports a digest for step " + std::to_string(step) +
                                                    ", outside its claimed steps"});
      break;
    }
  for (int64_t step : sample_steps(e, options.seed, options.samples_per_entry)) {
    const auto committed = e.gradient_digests.find(step);
    if (committed == e.gradient_digests.end()) {
      report.flags.push_back({e.cluster, e.seq, "claims step " + std::to_string(step) + " of job '" + e.job +
                                                    "' but committed no gradient digest for it"});
      continue;
    }
    const std::string expected = recompute(e.cluster, e.job, step);
    if (expected.empty()) {
      ++report.steps_skipped;
      continue;
    }
    ++report.steps_recomputed;
    if (expected == committed->second) {
      ++report.steps_matched;
      continue;
    }
    report.flags.push_back({e.cluster, e.seq, "step " + std::to_string(step) + " of job '" + e.job +
                                                  "': reported gradient digest " + committed->second.substr(0, 12) +
                                                  "... differs from the recomputed " + expected.substr(0, 12) + "..."});
  }
}

}  // namespace

std::vector<int64_t> sample_steps(const LedgerEntry& entry, uint64_t seed, int count) {
  std::vector<int64_t> out;
  if (entry.steps <= 0 || count <= 0) return out;
  if (entry.steps <= count) {
    for (int64_t s = 0; s < entry.steps; ++s) out.push_back(entry.first_step + s);
    return out;
  }
  ensure_sodium();
  std::set<int64_t> picked;
  for (uint64_t i = 0; static_cast<int>(picked.size()) < count; ++i) {
    // SHA-256(domain || seed || entry hash || i), little-endian: the same draw on every machine.
    unsigned char input[sizeof kSampleDomain + 16 + 64] = {};
    std::memcpy(input, kSampleDomain, sizeof kSampleDomain);
    for (int b = 0; b < 8; ++b) {
      input[sizeof kSampleDomain + b] = static_cast<unsigned char>(seed >> (8 * b));
      input[sizeof kSampleDomain + 8 + b] = static_cast<unsigned char>(i >> (8 * b));
    }
    std::memcpy(input + sizeof kSampleDomain + 16, entry.hash.data(), std::min<size_t>(entry.hash.size(), 64));
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, input, sizeof input);
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= static_cast<uint64_t>(h[b]) << (8 * b);
    picked.insert(entry.first_step + static_cast<int64_t>(v % static_cast<uint64_t>(entry.steps)));
  }
  return {picked.begin(), picked.end()};
}

SpotCheckReport spot_check(const std::vector<LedgerEntry>& entries, const SpotCheckOptions& options,
                           const Recompute& recompute) {
  return spot_check_shares(entries, options,
                           [&](const std::string&, const std::string& job, int64_t step) { return recompute(job, step); });
}

SpotCheckReport spot_check_shares(const std::vector<LedgerEntry>& entries, const SpotCheckOptions& options,
                                  const RecomputeShare& recompute) {
  SpotCheckReport report;
  std::map<std::string, Claims> claims;  // job -> claimed step ranges
  std::map<std::pair<std::string, std::string>, Claims> own;  // shared steps: (job, cluster) -> its claimed ranges
  std::map<std::string, Levels> shares;                       // shared steps: job -> tokens claimed per step
  for (const LedgerEntry& e : entries) {
    check_work(e, options, report);
    const auto job = options.jobs.find(e.job);
    const JobWork* work = job == options.jobs.end() ? nullptr : &job->second;
    if (work && work->shared_steps)
      check_shared_claims(e, work, options.tolerance, own[{e.job, e.cluster}], shares[e.job], report);
    else
      check_double_claims(e, claims[e.job], report);
    check_digests(e, options, recompute, report);
  }
  return report;
}

std::vector<std::string> SpotCheckReport::flagged_clusters() const {
  std::set<std::string> names;
  for (const auto& f : flags) names.insert(f.cluster);
  return {names.begin(), names.end()};
}

}  // namespace crosstrain::scheduler
