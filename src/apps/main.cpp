// The `crosstrain` command: train, run, bench, demo.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <iostream>
#include <typeinfo>
#include <sstream>

#include "bench_comm.h"
#include "bench_cost_model.h"
#include "bench_pipeline.h"
#include "ckpt_cmd.h"
#include "error_line.h"
#include "crosstrain/core/error.h"
#include "demo_comm.h"
#include "launcher.h"
#include "train_cmd.h"

using namespace crosstrain;

namespace {

// The whole line in one write: a rank stopped by the launcher between two writes would leave a bare prefix.
void print_error(const std::string& line) { std::cerr << line + "\n" << std::flush; }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  CLI::App app{"crosstrain: train large neural networks across devices, machines and clusters"};
  app.require_subcommand(1);
  // A count of ranks: CLI11's PositiveNumber would answer 0 with a 300-digit range.
  const CLI::Validator at_least_one(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          if (std::stol(text, &used) >= 1 && used == text.size()) return {};
        } catch (const std::exception&) {
        }
        return "must be a whole number of at least 1, got '" + text + "'";
      },
      "N>=1");

  // run: the launcher. Everything after `--` is the command.
  apps::LaunchOptions launch;
  std::string master;
  double timeout_s = 30;
  auto* run = app.add_subcommand("run", "start N local ranks of a program with torchrun's environment");
  run->add_option("--nproc,--nproc-per-node", launch.nproc, "ranks on this node")->check(at_least_one);
  run->add_option("--nnodes", launch.nnodes, "number of nodes")->check(at_least_one);
  run->add_option("--node-rank", launch.node_rank, "this node's index (0 hosts the rendezvous store)");
  run->add_option("--master", master, "HOST:PORT of the rendezvous store on node 0 (default: a free local port)");
  run->add_option("--timeout", timeout_s, "seconds to wait for the rendezvous");
  int run_cluster = -1;
  run->add_option("--cluster", run_cluster, "this node's cluster (exported as CROSSTRAIN_CLUSTER: sync.mode)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("command", launch.command, "program and its arguments (after --)")->required();

  apps::BenchCommOptions bench;
  std::string sizes;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  auto* bench_comm = bench_cmd->add_subcommand("comm", "collective benchmark with nccl-tests columns");
  bench_comm->add_option("--op", bench.op, "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, "
                                           "gather, scatter, sendrecv or all");
  bench_comm->add_option("--backend", bench.backend,
                          "gloo, gloo+shm (same-host float all-reduce in shared memory), or mpi (under mpirun)")
      ->check(CLI::IsMember({"gloo", "gloo+shm", "mpi"}));
  bench_comm->add_option("--nproc", bench.nproc, "ranks to start when not already launched")->check(at_least_one);
  bench_comm->add_option("--sizes", sizes, "MIN:MAX bytes, e.g. 4:256M (default 4:64M)");
  bench_comm->add_option("--step-factor", bench.step_factor, "multiply the size by this each row");
  bench_comm->add_option("--iters", bench.iters, "timed iterations per size, fewer for large sizes (default: about 0.3 s per size, 3 to 10000)");
  bench_comm->add_option("--warmup", bench.warmup, "untimed iterations per size");
  bench_comm->add_option("--piece-bytes", bench.piece_bytes,
                         "ring all-reduce: bytes per pipelined piece (default 1 MiB; 0: whole chunks)")
      ->check(CLI::NonNegativeNumber);
  bench_comm->add_option("--dtype", bench.dtype, "float, double, half, bfloat16, int8, uint8, int32, int64");
  bench_comm->add_option("--redop", bench.redop, "sum, avg, min, max, prod");
  bench_comm->add_option("--root", bench.root, "root rank of rooted collectives");
  bench_comm->add_option("--timeout", bench.timeout_s, "seconds before a collective counts as failed");
  bench_comm->add_option("--json", bench.json, "also write the rows as JSON to this file");
  bench_comm->add_option("--algo", bench.algo, "builtin (the back end's), ring, tree, hd, hierarchical, auto (cost model)");
  apps::BenchCostModelOptions model;
  auto* bench_model = bench_cmd->add_subcommand(
      "cost-model", "cost model's predicted time next to the measured one (ring, tree, hd; all-reduce by default)");
  bench_model->add_option("--nproc", model.nproc, "ranks to start when not already launched")->check(at_least_one);
  bench_model->add_option("--topology", model.topology, "links from this topology file instead of calibrating them")
      ->check(CLI::ExistingFile);
  bench_model->add_option("--repeat", model.repeat, "calibrate-and-measure repetitions (the table shows medians)")
      ->check(CLI::PositiveNumber);
  bench_model->add_option("--timeout", model.timeout_s, "seconds before a collective counts as failed");
  bench_model->add_option("--op", model.op, "allreduce, reducescatter, allgather, broadcast, or all")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "allgather", "broadcast", "all"}));
  bench_model->add_option("--backend", model.backend, "gloo, or mpi (under mpirun)")
      ->check(CLI::IsMember({"gloo", "mpi"}));
  bench_comm->add_option("--group-size", bench.group_size, "ranks per group for --algo hierarchical");
  bench_comm->add_option("--compression", bench.compression,
                         "all-reduce through a codec: none, bf16, fp16, int8, int4, topk:F, powersgd:R");

  apps::TrainCommand train;
  auto* train_cmd = app.add_subcommand("train", "train a model from a TOML recipe");
  train_cmd->add_option("config", train.config_path, "recipe, e.g. recipes/gpt-tiny.toml")->required();
  train_cmd->add_option("--nproc", train.nproc, "ranks to start when not already launched")->check(at_least_one);
  train_cmd->add_option("--set", train.sets, "override a key: --set train.steps=30 (repeatable)");
  train_cmd->add_flag("--resume", train.resume, "continue from the newest checkpoint in run.dir");

  apps::BenchPipelineOptions pipe;
  std::string pipe_stages, pipe_micro;
  auto* bench_pipe = bench_cmd->add_subcommand("pipeline", "pipeline bubble of each schedule, measured against theory");
  bench_pipe->add_option("--stages", pipe_stages, "pipeline depths, e.g. 2,4 (default 2,4)");
  bench_pipe->add_option("--microbatches", pipe_micro, "micro-batch counts, e.g. 4,8 (default 4,8)");
  bench_pipe->add_option("--schedule", pipe.schedules, "gpipe, 1f1b, interleaved, zb-h1 (repeatable; default all)");
  bench_pipe->add_option("--layers", pipe.layers, "GPT layers");
  bench_pipe->add_option("--width", pipe.width, "GPT width");
  bench_pipe->add_option("--context", pipe.context, "sequence length");
  bench_pipe->add_option("--batch", pipe.batch, "sequences per micro-batch");
  bench_pipe->add_option("--steps", pipe.steps, "timed steps per measurement");
  bench_pipe->add_option("--trace", pipe.trace_dir, "write a Chrome/Perfetto trace of each run into this folder");

  int demo_nproc = 2;
  auto* demo = app.add_subcommand("demo", "a short tour of the collectives on local ranks");
  demo->add_option("--nproc", demo_nproc, "ranks to start")->check(at_least_one);

  std::string ckpt_path, ckpt_out;
  bool ckpt_tensors = false, ckpt_optimizer = false, ckpt_verify = false;
  auto* ckpt = app.add_subcommand("ckpt", "inspect and export distributed checkpoints");
  ckpt->require_subcommand(1);
  auto* ckpt_info = ckpt->add_subcommand("info", "summary of a checkpoint (or of a run directory's newest)");
  ckpt_info->add_option("path", ckpt_path, "checkpoint or run directory")->required();
  ckpt_info->add_flag("--tensors", ckpt_tensors, "list every tensor with its shape and how it is stored");
  ckpt_info->add_flag("--verify", ckpt_verify, "also read every piece and check its checksum (sizes are always checked)");
  auto* ckpt_export = ckpt->add_subcommand("export", "write one consolidated safetensors file with plain names");
  ckpt_export->add_option("path", ckpt_path, "checkpoint or run directory")->required();
  ckpt_export->add_option("output", ckpt_out, "output .safetensors file")->required();
  ckpt_export->add_flag("--optimizer", ckpt_optimizer, "also export the Adam moments");

  auto is_command = [&](const std::string& name) {
    for (const auto* sub : app.get_subcommands({}))
      if (sub->check_name(name)) return true;
    return false;
  };
  if (!args.empty() && args[0].rfind("-", 0) != 0 && !is_command(args[0])) {
    std::cerr << "crosstrain: unknown command '" << args[0] << "'; the commands are train, run, bench, ckpt, demo"
              << " (crosstrain --help)" << std::endl;
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // One line, with the way to the help.
    std::cerr << "crosstrain: " << apps::error_line(e.what(), e.get_name()) << " (crosstrain --help)" << std::endl;
    return e.get_exit_code();
  }

  try {
    if (*run) {
      if (!master.empty()) apps::parse_master(master, launch.master_addr, launch.master_port);
      launch.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      if (run_cluster >= 0) launch.extra_env["CROSSTRAIN_CLUSTER"] = std::to_string(run_cluster);
      return apps::launch(launch);
    }
    if (*bench_model) return apps::bench_cost_model(model, args);
    if (*bench_comm) {
      if (!sizes.empty()) apps::parse_sizes(sizes, bench.min_bytes, bench.max_bytes);
      return apps::bench_comm(bench, args);
    }
    if (*demo) return apps::demo_comm(demo_nproc, args);
    if (*bench_pipe) {
      auto ints = [](const std::string& text, std::vector<int>& out) {
        if (text.empty()) return;
        out.clear();
        std::stringstream in(text);
        for (std::string item; std::getline(in, item, ',');) {
          try {
            out.push_back(std::stoi(item));
          } catch (const std::exception&) {
            throw UsageError("'" + text + "' is not a comma-separated list of integers");
          }
        }
      };
      ints(pipe_stages, pipe.stages);
      ints(pipe_micro, pipe.microbatches);
      return apps::bench_pipeline(pipe, args);
    }
    if (*train_cmd) return apps::train_command(train, args);
    if (*ckpt_info) return apps::ckpt_info(ckpt_path, ckpt_tensors, ckpt_verify);
    if (*ckpt_export) return apps::ckpt_export(ckpt_path, ckpt_out, ckpt_optimizer);
  } catch (const UsageError& e) {
    print_error("crosstrain: " + apps::error_line(e.what(), "invalid input"));
    return 2;
  } catch (const c10::Error& e) {
    // libtorch's messages carry a C++ backtrace: show the first line only.
    print_error("crosstrain: error: " + apps::error_line(e.what_without_backtrace(), "libtorch failed without a message"));
    return 1;
  } catch (const std::exception& e) {
    print_error("crosstrain: error: " +
                apps::error_line(e.what(), std::string("unexpected failure without a message (") + typeid(e).name() + ")"));
    return 1;
  }
  return 0;
}
