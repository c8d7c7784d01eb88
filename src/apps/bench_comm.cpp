#include "bench_comm.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "crosstrain/comm/algorithms.h"
#include "crosstrain/comm/compression.h"
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

int bench_comm(const BenchCommOptions& o, const std::vector<std::string>& relaunch_args) {
  if (o.step_factor < 2) throw UsageError("--step-factor must be at least 2");
  if (o.iters < 0 || o.warmup < 0) throw UsageError("--iters must be at least 1 (or 0: automatic) and --warmup at least 0");
  std::vector<std::string> ops = o.op == "all" ? bench_ops() : std::vector<std::string>{o.op};
  for (const auto& op : ops)
    if (std::find(bench_ops().begin(), bench_ops().end(), op) == bench_ops().end())
      throw UsageError("unknown --op '" + op + "'; use one of allreduce, broadcast, reduce, allgather, "
                       "reducescatter, alltoall, gather, scatter, sendrecv, all");
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
  comm::CommConfig config;
  config.backend = o.backend == "mpi" ? "mpi" : "gloo";
  config.shared_memory = o.backend == "gloo+shm";
  config.timeout_s = o.timeout_s;
  auto world = comm::init_world(env, config);
  Communicator& c = *world;
  const bool leader = c.rank() == 0;
  std::unique_ptr<comm::Codec> codec;
  comm::ErrorFeedback feedback;
  if (o.compression != "none") codec = comm::make_codec(o.compression);
  comm::algo::Algorithm algorithm = o.algo == "auto" ? comm::algo::Algorithm::Ring : comm::algo::parse_algorithm(o.algo);
  comm::algo::Hierarchy hierarchy;
  if (algorithm == comm::algo::Algorithm::Hierarchical) hierarchy = comm::algo::make_hierarchy(c, o.group_size);
  nlohmann::json rows = nlohmann::json::array();
  int64_t total_wrong = 0;

  for (const auto& op : ops) {
    if (leader) {
      std::printf("# crosstrain bench comm: op %s, backend %s, algo %s, %d ranks, dtype %s, iters %s, warmup %d\n",
                  op.c_str(), c.backend().c_str(), o.algo.c_str(), c.size(), o.dtype.c_str(),
                  o.iters > 0 ? std::to_string(o.iters).c_str() : "auto (~0.3 s per size)", o.warmup);
      std::printf("#%13s %12s %9s %7s %5s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop", "root",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    double busbw_sum = 0;
    int measured = 0;
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
      Case k = make_case(c, op, bytes, dtype, redop, o.root);
      comm::algo::Algorithm chosen = algorithm;
      if (o.algo == "auto") {
        // The cost model picks per operation and size, for this host with its default (loopback) link; the
        // operations it does not model stay with the back end.
        const std::vector<std::pair<std::string, comm::Collective>> modeled{
            {"allreduce", comm::Collective::AllReduce}, {"reducescatter", comm::Collective::ReduceScatter},
            {"allgather", comm::Collective::AllGather}, {"broadcast", comm::Collective::Broadcast}};
        auto it = std::find_if(modeled.begin(), modeled.end(), [&](const auto& m) { return m.first == op; });
        chosen = comm::algo::Algorithm::Builtin;
        if (it != modeled.end())
          chosen = comm::choose_algorithm(it->second, static_cast<double>(bytes), comm::detect_local_topology(c.size()));
        if (leader && it != modeled.end())
          std::printf("# auto: %lld bytes -> %s\n", static_cast<long long>(bytes), comm::algo::to_string(chosen));
      }
      if (chosen != comm::algo::Algorithm::Builtin) use_algorithm(k, c, op, chosen, redop, o.root, &hierarchy, o.piece_bytes);
      int64_t codec_bytes = -1;
      if (codec) {
        if (op != "allreduce" || dtype != at::kFloat || redop != ReduceOp::Avg)
          throw UsageError("--compression applies to --op allreduce --dtype float --redop avg (codecs average)");
        // Averages through the codec; the check below compares with the exact average within the codec's error.
        k.run = [&c, t = k.input, &codec, &feedback, &codec_bytes]() mutable {
          codec_bytes = comm::compressed_all_reduce(c, t, *codec, &feedback, 0).bytes_sent;
          return comm::completed_work();
        };
        feedback.reset();  // a new buffer size
      }
      const int64_t size_bytes = k.count * static_cast<int64_t>(c10::elementSize(dtype));
      // Correctness first, on fresh inputs; in-place ops then keep transforming the buffer while timed.
      k.run()->wait();
      int64_t wrong = codec ? 0 : count_wrong(k);
      if (codec) {
        // Lossy: count elements further from the exact average than 1% of the buffer's largest value.
        at::Tensor got = k.output.reshape(-1).to(at::kDouble), want = k.expected.reshape(-1).to(at::kDouble);
        const double bound = 0.01 * std::max(1.0, want.abs().max().item<double>());
        wrong = got.numel() ? (got - want).abs().gt(bound).sum().item<int64_t>() : 0;
      }
      auto t0 = Clock::now();
      for (int i = 0; i < o.warmup; ++i) k.run()->wait();
      double warm = o.warmup > 0 ? std::chrono::duration<double>(Clock::now() - t0).count() / o.warmup : 0.0;
      // Iterations fill a time budget (large sizes get fewer, at least 3): small sizes need thousands, or the
      // skew of leaving the barrier (tens of microseconds) dominates a time of a few microseconds.
      warm = max_over_ranks(c, warm);
      const int most = o.iters > 0 ? o.iters : 10000;
      const double budget_s = o.iters > 0 ? 1.0 : 0.3;
      int iters = o.iters > 0 ? o.iters : 20;
      if (warm > 0) iters = static_cast<int>(std::max(3.0, std::min<double>(most, budget_s / warm)));
      c.barrier()->wait();
      t0 = Clock::now();
      for (int i = 0; i < iters; ++i) k.run()->wait();
      double seconds = max_over_ranks(c, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
      at::Tensor wrong_all = at::full({1}, wrong, at::kLong);
      c.all_reduce(wrong_all, ReduceOp::Sum)->wait();
      wrong = wrong_all.item<int64_t>();
      total_wrong += wrong;
      const double algbw = seconds > 0 ? size_bytes / seconds / 1e9 : 0.0;
      const double busbw = algbw * busbw_factor(op, c.size());
      busbw_sum += busbw;
      ++measured;
      const std::string redop_name = reduces(op) ? comm::to_string(redop) : "none";
      const int root = rooted(op) ? o.root : -1;
      if (leader) {
        std::printf("%14s %12lld %9s %7s %5d %12.1f %12.3f %12.3f %8lld\n", std::to_string(size_bytes).c_str(),
                    static_cast<long long>(k.count), o.dtype.c_str(), redop_name.c_str(), root, seconds * 1e6, algbw,
                    busbw, static_cast<long long>(wrong));
        if (codec && codec_bytes >= 0)
          std::printf("#   %s: %lld bytes sent by this rank, %.2fx fewer than a float all-reduce\n", o.compression.c_str(),
                      static_cast<long long>(codec_bytes),
                      codec_bytes > 0 ? 2.0 * (c.size() - 1) / c.size() * size_bytes / codec_bytes : 0.0);
        std::fflush(stdout);
        rows.push_back({{"op", op}, {"backend", c.backend()}, {"algo", o.algo}, {"nranks", c.size()}, {"size", size_bytes},
                        {"count", k.count}, {"type", o.dtype}, {"redop", redop_name}, {"root", root},
                        {"iters", iters}, {"time_us", seconds * 1e6}, {"algbw", algbw}, {"busbw", busbw},
                        {"wrong", wrong}});
      }
      if (bytes == 0) break;
    }
    if (leader) std::printf("# Avg bus bandwidth    : %.3f GB/s\n#\n", measured ? busbw_sum / measured : 0.0);
  }
  if (leader && !o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) throw UsageError("cannot write --json file '" + o.json + "'");
    out << rows.dump(2) << "\n";
  }
  c.barrier()->wait();
  if (total_wrong != 0) {
    if (leader) std::fprintf(stderr, "bench comm: %lld wrong elements\n", static_cast<long long>(total_wrong));
    return 1;
  }
  return 0;
}

}  // namespace crosstrain::apps
