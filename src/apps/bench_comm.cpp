#include "bench_comm.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <utility>

#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/comm/reference.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"
#include "launcher.h"

namespace crosstrain::apps {
namespace {

using comm::Communicator;
using comm::max_over_ranks;
using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float" || name == "float32") return at::kFloat;
  if (name == "double" || name == "float64") return at::kDouble;
  if (name == "half" || name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "int8") return at::kChar;
  if (name == "uint8") return at::kByte;
  if (name == "int32") return at::kInt;
  if (name == "int64") return at::kLong;
  throw UsageError("unknown --dtype '" + name + "'; use float, double, half, bfloat16, int8, uint8, int32 or int64");
}

bool sliced(const std::string& op) {
  return op == "allgather" || op == "gather" || op == "scatter" || op == "reducescatter" || op == "alltoall";
}

bool reduces(const std::string& op) { return op == "allreduce" || op == "reduce" || op == "reducescatter"; }

bool rooted(const std::string& op) { return op == "broadcast" || op == "reduce" || op == "gather" || op == "scatter"; }

// Small integers stay exact in every dtype, so results are checked for equality.
at::Tensor pattern(int64_t numel, int64_t offset, int64_t modulus, at::ScalarType dtype) {
  return (at::arange(offset, offset + numel, at::kLong).remainder(modulus)).to(dtype);
}

// Everything one measurement needs: buffers, the operation, and its expected result.
struct Case {
  at::Tensor input, output, expected;
  bool check_here = true;  // false on ranks whose output the op leaves unspecified
  std::function<comm::WorkPtr()> run;
  int64_t count = 0;       // elements in the full buffer (nccl-tests "count")
};

// Replaces a case's run with one of our algorithms: one object per case, its scratch reserved for the case's
// size, so the timed calls allocate nothing (synchronous; returns a completed handle).
void use_algorithm(Case& k, Communicator& c, const std::string& op, comm::algo::Algorithm a, ReduceOp redop, int root,
                   comm::algo::Hierarchy* h, int64_t piece_bytes) {
  using comm::algo::Algorithm;
  namespace algo = comm::algo;
  auto done = [] { return comm::completed_work(); };
  std::shared_ptr<algo::CollectiveAlgorithm> obj;
  algo::AlgorithmOptions options;
  if (piece_bytes >= 0) options.piece_bytes = piece_bytes;
  if (a == Algorithm::Hierarchical) obj = std::make_shared<algo::HierarchicalAlgorithm>(c, *h, options);
  else obj = algo::make_algorithm(a, c, options);
  const at::Tensor& sized = op == "allgather" ? k.output : k.input;
  if (sized.defined()) obj->reserve(sized.numel(), sized.scalar_type());
  if (op == "allreduce") {
    k.run = [obj, t = k.input, redop, done]() mutable {
      obj->all_reduce(t, redop);
      return done();
    };
  } else if (op == "reducescatter") {
    k.run = [obj, in = k.input, out = k.output, redop, done]() mutable {
      obj->reduce_scatter(in, out, redop);
      return done();
    };
  } else if (op == "allgather") {
    k.run = [obj, in = k.input, out = k.output, done]() mutable {
      obj->all_gather(in, out);
      return done();
    };
  } else if (op == "broadcast") {
    k.run = [obj, t = k.input, root, done]() mutable {
      obj->broadcast(t, root);
      return done();
    };
  } else if (op == "alltoall") {
    k.run = [obj, in = k.input, out = k.output, done]() mutable {
      obj->all_to_all(in, out);
      return done();
    };
  } else {
    throw UsageError("--algo " + std::string(algo::to_string(a)) + " does not implement " + op +
                     "; our algorithms (ring, tree, hd, hierarchical) implement allreduce, reducescatter, allgather, "
                     "broadcast and alltoall (pairwise)");
  }
}

Case make_case(Communicator& c, const std::string& op, int64_t bytes, at::ScalarType dtype, ReduceOp redop,
               int root) {
  const int64_t n = c.size(), r = c.rank();
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t count = bytes / elem;
  if (sliced(op)) count -= count % n;
  const int64_t per = sliced(op) ? count / n : count;
  // Reductions are exact on values in 0..2; a product of n values stays small with 0/1 inputs.
  const int64_t modulus = redop == ReduceOp::Product ? 2 : 3;
  auto opts = at::TensorOptions().dtype(dtype);
  Case k;
  k.count = count;
  auto value_of = [&](int64_t rank_, int64_t len, int64_t offset) { return pattern(len, offset + rank_, modulus, dtype); };
  auto reduce_all = [&](int64_t len, int64_t offset) {
    std::vector<at::Tensor> parts;
    for (int64_t q = 0; q < n; ++q) parts.push_back(value_of(q, len, offset));
    return comm::reduce_reference(parts, redop);
  };
  if (op == "allreduce" || op == "reduce") {
    k.input = value_of(r, count, 0);
    k.output = k.input;
    k.expected = reduce_all(count, 0);
    k.check_here = op == "allreduce" || r == root;
    if (op == "allreduce") k.run = [&c, t = k.input, redop]() mutable { return c.all_reduce(t, redop); };
    else k.run = [&c, t = k.input, redop, root]() mutable { return c.reduce(t, root, redop); };
  } else if (op == "broadcast") {
    k.input = r == root ? value_of(root, count, 0) : at::zeros({count}, opts);
    k.output = k.input;
    k.expected = value_of(root, count, 0);
    k.run = [&c, t = k.input, root]() mutable { return c.broadcast(t, root); };
  } else if (op == "allgather" || op == "gather") {
    k.input = value_of(r, per, 0);
    k.output = at::zeros({count}, opts);
    std::vector<at::Tensor> parts;
    for (int64_t q = 0; q < n; ++q) parts.push_back(value_of(q, per, 0));
    k.expected = at::cat(parts);
    k.check_here = op == "allgather" || r == root;
    if (op == "allgather") k.run = [&c, in = k.input, out = k.output]() mutable { return c.all_gather(in, out); };
    else k.run = [&c, in = k.input, out = k.output, root]() mutable { return c.gather(in, out, root); };
  } else if (op == "scatter") {
    k.input = r == root ? pattern(count, 0, 5, dtype) : at::Tensor();
    k.output = at::zeros({per}, opts);
    k.expected = pattern(per, r * per, 5, dtype);
    k.run = [&c, in = k.input, out = k.output, root]() mutable { return c.scatter(in, out, root); };
  } else if (op == "reducescatter") {
    k.input = value_of(r, count, 0);
    k.output = at::zeros({per}, opts);
    k.expected = reduce_all(count, 0).slice(0, r * per, (r + 1) * per);
    k.run = [&c, in = k.input, out = k.output, redop]() mutable { return c.reduce_scatter(in, out, redop); };
  } else if (op == "alltoall") {
    // Slice j of rank q holds pattern(offset q*n + j): rank r receives slice r of everyone.
    std::vector<at::Tensor> mine, expect;
    for (int64_t j = 0; j < n; ++j) mine.push_back(pattern(per, r * n + j, 5, dtype));
    for (int64_t q = 0; q < n; ++q) expect.push_back(pattern(per, q * n + r, 5, dtype));
    k.input = at::cat(mine);
    k.output = at::zeros({count}, opts);
    k.expected = at::cat(expect);
    k.run = [&c, in = k.input, out = k.output]() mutable { return c.all_to_all(in, out); };
  } else if (op == "sendrecv") {
    // A ring: send to the next rank while receiving from the previous one.
    const int next = static_cast<int>((r + 1) % n), prev = static_cast<int>((r + n - 1) % n);
    k.input = value_of(r, count, 0);
    k.output = at::zeros({count}, opts);
    k.expected = n == 1 ? k.output.clone() : value_of(prev, count, 0);
    k.run = [&c, in = k.input, out = k.output, next, prev]() mutable -> comm::WorkPtr {
      if (c.size() == 1) return c.barrier();
      auto s = c.send(in, next, 7);
      auto w = c.recv(out, prev, 7);
      s->wait();
      return w;
    };
  } else {
    throw UsageError("unknown --op '" + op + "'");
  }
  return k;
}

int64_t count_wrong(const Case& k) {
  if (!k.check_here) return 0;
  return (k.output.reshape(-1).to(at::kDouble) != k.expected.reshape(-1).to(at::kDouble)).sum().item<int64_t>();
}

}  // namespace

const std::vector<std::string>& bench_ops() {
  static const std::vector<std::string> ops{"allreduce", "broadcast", "reduce", "allgather", "reducescatter",
                                            "alltoall", "gather", "scatter", "sendrecv"};
  return ops;
}

double busbw_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reducescatter" || op == "alltoall" || op == "gather" || op == "scatter")
    return static_cast<double>(n - 1) / n;
  return 1.0;
}

void parse_sizes(const std::string& text, int64_t& min_bytes, int64_t& max_bytes) {
  auto one = [&](const std::string& s) -> int64_t {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
    }
    std::string unit = s.substr(used);
    int64_t mult = 1;
    if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") mult = 1LL << 10;
    else if (unit == "M" || unit == "MB" || unit == "MiB") mult = 1LL << 20;
    else if (unit == "G" || unit == "GB" || unit == "GiB") mult = 1LL << 30;
    else if (!unit.empty() && unit != "B") used = 0;
    if (used == 0 || v < 0) throw UsageError("--sizes: '" + s + "' is not a size like 4, 64K, 16M or 1G");
    return static_cast<int64_t>(v * mult);
  };
  auto colon = text.find(':');
  min_bytes = one(text.substr(0, colon));
  max_bytes = colon == std::string::npos ? min_bytes : one(text.substr(colon + 1));
  if (max_bytes < min_bytes) throw UsageError("--sizes " + text + ": the largest size is below the smallest");
}

namespace {

// The collectives to run, after the checks that need no ranks. Throws UsageError.
std::vector<std::string> checked_ops(const BenchCommOptions& o) {
  if (o.step_factor < 2) throw UsageError("--step-factor must be at least 2");
  if (o.iters < 0 || o.warmup < 0) throw UsageError("--iters must be at least 1 (or 0: automatic) and --warmup at least 0");
  std::vector<std::string> ops = o.op == "all" ? bench_ops() : std::vector<std::string>{o.op};
  for (const auto& op : ops)
    if (std::find(bench_ops().begin(), bench_ops().end(), op) == bench_ops().end())
      throw UsageError("unknown --op '" + op + "'; use one of allreduce, broadcast, reduce, allgather, "
                       "reducescatter, alltoall, gather, scatter, sendrecv, all");
  return ops;
}

std::unique_ptr<Communicator> join_world(const BenchCommOptions& o, const LaunchEnv& env) {
  comm::CommConfig config;
  config.backend = o.backend == "mpi" ? "mpi" : "gloo";
  config.shared_memory = o.backend == "gloo+shm";
  config.timeout_s = o.timeout_s;
  config.encrypt = o.encrypt;
  return comm::init_world(env, config);
}

// What every measurement of one run shares: the options, the ranks, how the collectives run, and the results.
struct Bench {
  Bench(const BenchCommOptions& options, Communicator& comm, at::ScalarType dtype_, ReduceOp redop_)
      : o(options), c(comm), dtype(dtype_), redop(redop_), leader(comm.rank() == 0) {
    if (o.compression != "none") codec = comm::make_codec(o.compression);
    algorithm = o.algo == "auto" ? comm::algo::Algorithm::Ring : comm::algo::parse_algorithm(o.algo);
    if (algorithm == comm::algo::Algorithm::Hierarchical) hierarchy = comm::algo::make_hierarchy(c, o.group_size);
  }

  const BenchCommOptions& o;
  Communicator& c;
  const at::ScalarType dtype;
  const ReduceOp redop;
  const bool leader;  // rank 0 prints and writes the JSON
  std::unique_ptr<comm::Codec> codec;
  comm::ErrorFeedback feedback;
  comm::algo::Algorithm algorithm = comm::algo::Algorithm::Builtin;
  comm::algo::Hierarchy hierarchy;
  nlohmann::json rows = nlohmann::json::array();
  int64_t total_wrong = 0;
};

// --algo auto: the cost model picks per operation and size, for this host with its default (loopback) link; the
// operations it does not model stay with the back end.
comm::algo::Algorithm auto_algorithm(const Bench& b, const std::string& op, int64_t bytes) {
  const std::vector<std::pair<std::string, comm::Collective>> modeled{
      {"allreduce", comm::Collective::AllReduce}, {"reducescatter", comm::Collective::ReduceScatter},
      {"allgather", comm::Collective::AllGather}, {"broadcast", comm::Collective::Broadcast}};
  auto it = std::find_if(modeled.begin(), modeled.end(), [&](const auto& m) { return m.first == op; });
  if (it == modeled.end()) return comm::algo::Algorithm::Builtin;
  auto chosen = comm::choose_algorithm(it->second, static_cast<double>(bytes), comm::detect_local_topology(b.c.size()));
  if (b.leader) std::printf("# auto: %lld bytes -> %s\n", static_cast<long long>(bytes), comm::algo::to_string(chosen));
  return chosen;
}

// Replaces a case's run with an all-reduce through the codec; `codec_bytes` receives what this rank sent.
void use_codec(Bench& b, const std::string& op, Case& k, int64_t& codec_bytes) {
  if (op != "allreduce" || b.dtype != at::kFloat || b.redop != ReduceOp::Avg)
    throw UsageError("--compression applies to --op allreduce --dtype float --redop avg (codecs average)");
  // Averages through the codec; the check compares with the exact average within the codec's error.
  k.run = [&c = b.c, t = k.input, &codec = b.codec, &feedback = b.feedback, &codec_bytes]() mutable {
    codec_bytes = comm::compressed_all_reduce(c, t, *codec, &feedback, 0).bytes_sent;
    return comm::completed_work();
  };
  b.feedback.reset();  // a new buffer size
}

// Elements of this rank's output that are wrong after one run; with a codec (lossy), those further from the exact
// average than 1% of the buffer's largest value.
int64_t wrong_here(const Bench& b, const Case& k) {
  if (!b.codec) return count_wrong(k);
  at::Tensor got = k.output.reshape(-1).to(at::kDouble), want = k.expected.reshape(-1).to(at::kDouble);
  const double bound = 0.01 * std::max(1.0, want.abs().max().item<double>());
  return got.numel() ? (got - want).abs().gt(bound).sum().item<int64_t>() : 0;
}

struct Timing {
  double seconds = 0;  // per call, the slowest rank's
  int iters = 0;
};

// Warm-up, then timed calls. Iterations fill a time budget (large sizes get fewer, at least 3): small sizes need
// thousands, or the skew of leaving the barrier (tens of microseconds) dominates a time of a few microseconds.
Timing time_case(Bench& b, Case& k) {
  const BenchCommOptions& o = b.o;
  auto t0 = Clock::now();
  for (int i = 0; i < o.warmup; ++i) k.run()->wait();
  double warm = o.warmup > 0 ? std::chrono::duration<double>(Clock::now() - t0).count() / o.warmup : 0.0;
  warm = max_over_ranks(b.c, warm);
  const int most = o.iters > 0 ? o.iters : 10000;
  const double budget_s = o.iters > 0 ? 1.0 : 0.3;
  Timing t;
  t.iters = o.iters > 0 ? o.iters : 20;
  if (warm > 0) t.iters = static_cast<int>(std::max(3.0, std::min<double>(most, budget_s / warm)));
  b.c.barrier()->wait();
  t0 = Clock::now();
  for (int i = 0; i < t.iters; ++i) k.run()->wait();
  t.seconds = max_over_ranks(b.c, std::chrono::duration<double>(Clock::now() - t0).count() / t.iters);
  return t;
}

void print_table_header(const Bench& b, const std::string& op) {
  const BenchCommOptions& o = b.o;
  std::printf("# crosstrain bench comm: op %s, backend %s, algo %s, %d ranks, dtype %s, iters %s, warmup %d\n",
              op.c_str(), b.c.backend().c_str(), o.algo.c_str(), b.c.size(), o.dtype.c_str(),
              o.iters > 0 ? std::to_string(o.iters).c_str() : "auto (~0.3 s per size)", o.warmup);
  std::printf("#%13s %12s %9s %7s %5s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop", "root",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

// One measured size, as the leader reports it.
struct Row {
  int64_t size_bytes = 0, count = 0, wrong = 0, codec_bytes = -1;
  Timing timing;
  double algbw = 0, busbw = 0;
};

// The table's row (and a line on the codec's traffic), and the same as JSON.
void report_row(Bench& b, const std::string& op, const Row& r) {
  const BenchCommOptions& o = b.o;
  const std::string redop_name = reduces(op) ? comm::to_string(b.redop) : "none";
  const int root = rooted(op) ? o.root : -1;
  if (!b.leader) return;
  std::printf("%14s %12lld %9s %7s %5d %12.1f %12.3f %12.3f %8lld\n", std::to_string(r.size_bytes).c_str(),
              static_cast<long long>(r.count), o.dtype.c_str(), redop_name.c_str(), root, r.timing.seconds * 1e6,
              r.algbw, r.busbw, static_cast<long long>(r.wrong));
  if (b.codec && r.codec_bytes >= 0)
    std::printf("#   %s: %lld bytes sent by this rank, %.2fx fewer than a float all-reduce\n", o.compression.c_str(),
                static_cast<long long>(r.codec_bytes),
                r.codec_bytes > 0 ? 2.0 * (b.c.size() - 1) / b.c.size() * r.size_bytes / r.codec_bytes : 0.0);
  std::fflush(stdout);
  b.rows.push_back({{"op", op}, {"backend", b.c.backend()}, {"algo", o.algo}, {"nranks", b.c.size()},
                    {"size", r.size_bytes}, {"count", r.count}, {"type", o.dtype}, {"redop", redop_name},
                    {"root", root}, {"iters", r.timing.iters}, {"time_us", r.timing.seconds * 1e6},
                    {"algbw", r.algbw}, {"busbw", r.busbw}, {"wrong", r.wrong}});
}

// Checks, then times one collective at one size on every rank, and reports the row. Returns its bus bandwidth.
double measure_row(Bench& b, const std::string& op, int64_t bytes) {
  Case k = make_case(b.c, op, bytes, b.dtype, b.redop, b.o.root);
  const comm::algo::Algorithm chosen = b.o.algo == "auto" ? auto_algorithm(b, op, bytes) : b.algorithm;
  if (chosen != comm::algo::Algorithm::Builtin)
    use_algorithm(k, b.c, op, chosen, b.redop, b.o.root, &b.hierarchy, b.o.piece_bytes);
  Row r;
  if (b.codec) use_codec(b, op, k, r.codec_bytes);
  r.size_bytes = k.count * static_cast<int64_t>(c10::elementSize(b.dtype));
  r.count = k.count;
  // Correctness first, on fresh inputs; in-place ops then keep transforming the buffer while timed.
  k.run()->wait();
  const int64_t wrong = wrong_here(b, k);
  r.timing = time_case(b, k);
  at::Tensor wrong_all = at::full({1}, wrong, at::kLong);
  b.c.all_reduce(wrong_all, ReduceOp::Sum)->wait();
  r.wrong = wrong_all.item<int64_t>();
  b.total_wrong += r.wrong;
  r.algbw = r.timing.seconds > 0 ? r.size_bytes / r.timing.seconds / 1e9 : 0.0;
  r.busbw = r.algbw * busbw_factor(op, b.c.size());
  report_row(b, op, r);
  return r.busbw;
}

// One table: every size from --sizes for one collective, and the average bus bandwidth.
void measure_op(Bench& b, const std::string& op) {
  if (b.leader) print_table_header(b, op);
  double busbw_sum = 0;
  int measured = 0;
  for (int64_t bytes = b.o.min_bytes; bytes <= b.o.max_bytes; bytes *= b.o.step_factor) {
    busbw_sum += measure_row(b, op, bytes);
    ++measured;
    if (bytes == 0) break;
  }
  if (b.leader) std::printf("# Avg bus bandwidth    : %.3f GB/s\n#\n", measured ? busbw_sum / measured : 0.0);
}

void write_json(const Bench& b) {
  if (!b.leader || b.o.json.empty()) return;
  std::ofstream out(b.o.json);
  if (!out) throw UsageError("cannot write --json file '" + b.o.json + "'");
  out << b.rows.dump(2) << "\n";
}

}  // namespace

int bench_comm(const BenchCommOptions& o, const std::vector<std::string>& relaunch_args) {
  const std::vector<std::string> ops = checked_ops(o);
  const at::ScalarType dtype = parse_dtype(o.dtype);
  const ReduceOp redop = comm::parse_reduce_op(o.redop);
  LaunchEnv env = detect_launch_env(current_environment());
  if (o.backend == "mpi" && env.source != LaunchSource::Mpi)
    throw UsageError("--backend mpi runs under mpirun: mpirun -np " + std::to_string(o.nproc) +
                     " crosstrain bench comm --backend mpi ...");
  if (env.source == LaunchSource::Single && o.nproc > 1)
    return launch_self(o.nproc, relaunch_args, std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  if (o.root < 0 || o.root >= env.world_size)
    throw UsageError("--root " + std::to_string(o.root) + " is outside 0.." + std::to_string(env.world_size - 1));

  limit_compute_threads(1);
  auto world = join_world(o, env);
  Bench b(o, *world, dtype, redop);
  for (const auto& op : ops) measure_op(b, op);
  write_json(b);
  b.c.barrier()->wait();
  if (b.total_wrong != 0) {
    if (b.leader) std::fprintf(stderr, "bench comm: %lld wrong elements\n", static_cast<long long>(b.total_wrong));
    return 1;
  }
  return 0;
}

}  // namespace crosstrain::apps
