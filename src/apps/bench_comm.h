// `crosstrain bench comm`: nccl-tests style collective benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::apps {

struct BenchCommOptions {
  std::string op = "allreduce";   // one collective, or "all"
  std::string backend = "gloo";
  std::string algo = "builtin";   // builtin (the back end's), ring, tree, hd, hierarchical
  int group_size = 2;             // hierarchical: ranks per group
  std::string compression = "none";  // all-reduce through a codec (comm/compression/codecs.h)
  std::string encrypt = "off";     // comm.encrypt: off, all (sealed messages; needs CROSSTRAIN_SECRET)
  int nproc = 2;
  int64_t min_bytes = 4;
  int64_t max_bytes = 64LL << 20;
  int step_factor = 2;
  int iters = 0;   // 0: as many as fit in about 0.3 s per size (at least 3, at most 10000)
  int warmup = 5;
  std::string dtype = "float";
  std::string redop = "sum";
  int root = 0;
  double timeout_s = 30;
  int64_t piece_bytes = -1;        // ring all-reduce pieces (AlgorithmOptions::piece_bytes); -1: the default
  std::string json;               // rows as JSON, written by rank 0
};

// Parses "4:256M" (or one size) into bytes; K, M, G are powers of 1024. Throws UsageError.
void parse_sizes(const std::string& text, int64_t& min_bytes, int64_t& max_bytes);

// The collectives `bench comm` knows, in the order `--op all` runs them.
const std::vector<std::string>& bench_ops();

// Bus bandwidth factor of nccl-tests for an op on n ranks.
double busbw_factor(const std::string& op, int n);

// Runs in every rank (launches the ranks itself when started alone). Returns the exit code.
int bench_comm(const BenchCommOptions& options, const std::vector<std::string>& relaunch_args);

}  // namespace crosstrain::apps
