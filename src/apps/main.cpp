// The `crosstrain` command: train, run, bench, demo.
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "bench_attention.h"
#include "bench_seal.h"
#include "bench_comm.h"
#include "bench_cost_model.h"
#include "bench_pipeline.h"
#include "bench_scheduler.h"
#include "ckpt_cmd.h"
#include "error_line.h"
#include "crosstrain/core/error.h"
#include "demo_comm.h"
#include "launcher.h"
#include "keys_cmd.h"
#include "ledger_cmd.h"
#include "scheduler_cmd.h"
#include "plan_cmd.h"
#include "report_cmd.h"
#include "config_cmd.h"
#include "tokenize_cmd.h"
#include "train_cmd.h"

using namespace crosstrain;

namespace {

// The whole line in one write: a rank stopped by the launcher between two writes would leave a bare prefix.
void print_error(const std::string& line) { std::cerr << line + "\n" << std::flush; }

// A count of ranks: CLI11's PositiveNumber would answer 0 with a 300-digit range.
CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          if (std::stol(text, &used) >= 1 && used == text.size()) return {};
        } catch (const std::exception&) {
        }
        return "must be a whole number of at least 1, got '" + text + "'";
      },
      "N>=1");
}

// Each subcommand: its CLI11 node and the values its options fill in. CLI11 keeps pointers to the values, so these
// live in one CommandLine that does not move.

// `crosstrain run`: the launcher. Everything after `--` is the command.
struct RunCli {
  CLI::App* cmd = nullptr;
  apps::LaunchOptions launch;
  std::string master;
  std::string standby;
  std::string nnodes = "1";
  std::string node_sizes;
  double timeout_s = 30;
  int cluster = -1;
};

// "--nnodes N" or "MIN:MAX" (elastic: nodes beyond MIN may join the running job).
void parse_nnodes(const std::string& text, apps::LaunchOptions& o) {
  const auto colon = text.find(':');
  auto number = [&](const std::string& part) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || v < 1)
      throw UsageError("--nnodes '" + text + "' must be N or MIN:MAX with 1 <= MIN <= MAX, e.g. --nnodes 1:4");
    return v;
  };
  o.nnodes = number(colon == std::string::npos ? text : text.substr(colon + 1));
  if (colon == std::string::npos) return;
  o.elastic.min_nnodes = number(text.substr(0, colon));
  if (o.elastic.min_nnodes > o.nnodes)
    throw UsageError("--nnodes '" + text + "': MIN is larger than MAX; use e.g. --nnodes 1:4");
  o.elastic.enabled = o.elastic.enabled || o.elastic.min_nnodes < o.nnodes;
}

void add_run_command(CLI::App& app, RunCli& run) {
  run.cmd = app.add_subcommand("run", "start N local ranks of a program with torchrun's environment");
  run.cmd->add_option("--nproc,--nproc-per-node", run.launch.nproc, "ranks on this node")->check(at_least_one());
  run.cmd->add_option("--nnodes", run.nnodes, "number of nodes, or MIN:MAX (elastic: nodes may join later)");
  run.cmd->add_option("--max-restarts", run.launch.elastic.max_restarts,
                      "elastic: restart failed ranks up to N times in all; the others train on meanwhile")
      ->check(CLI::NonNegativeNumber);
  run.cmd->add_option("--node-rank", run.launch.node_rank, "this node's index (0 hosts the rendezvous store)");
  run.cmd->add_option("--node-sizes", run.node_sizes,
                      "ranks of every node in node-rank order when they differ, e.g. 2,1,1 (the same on every launcher)");
  run.cmd->add_option("--master", run.master, "HOST:PORT of the rendezvous store on node 0 (default: a free local port)");
  run.cmd->add_option("--standby", run.standby,
                      "elastic, several nodes: HOST:PORT where node 1 keeps a standby store; its coordinator takes "
                      "over when node 0 is lost (the same on every launcher)");
  run.cmd->add_flag("--rejoin", run.launch.rejoin,
                    "node 0 started again after the standby took over (--standby): join the running job at --master "
                    "(give the standby's HOST:PORT) instead of hosting a new store");
  run.cmd->add_option("--timeout", run.timeout_s, "seconds to wait for the rendezvous");
  run.cmd->add_option("--cluster", run.cluster, "this node's cluster (exported as CROSSTRAIN_CLUSTER: sync.mode)")
      ->check(CLI::NonNegativeNumber);
  run.cmd->add_option("command", run.launch.command, "program and its arguments (after --)")->required();
}

int run_launcher(RunCli& run) {
  if (!run.master.empty()) apps::parse_master(run.master, run.launch.master_addr, run.launch.master_port);
  if (!run.standby.empty())
    apps::parse_master(run.standby, run.launch.standby_addr, run.launch.standby_port, "--standby");
  parse_nnodes(run.nnodes, run.launch);
  if (!run.node_sizes.empty()) run.launch.node_sizes = apps::parse_node_sizes(run.node_sizes);
  if (run.launch.elastic.max_restarts > 0) run.launch.elastic.enabled = true;
  run.launch.timeout = std::chrono::milliseconds(static_cast<int64_t>(run.timeout_s * 1000));
  if (run.cluster >= 0) run.launch.extra_env["CROSSTRAIN_CLUSTER"] = std::to_string(run.cluster);
  return apps::launch(run.launch);
}

// `crosstrain bench comm`.
struct BenchCommCli {
  CLI::App* cmd = nullptr;
  apps::BenchCommOptions options;
  std::string sizes;
};

void add_bench_comm_command(CLI::App& bench, BenchCommCli& comm) {
  apps::BenchCommOptions& o = comm.options;
  CLI::App* cmd = comm.cmd = bench.add_subcommand("comm", "collective benchmark with nccl-tests columns");
  cmd->add_option("--op", o.op, "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, "
                                "gather, scatter, sendrecv or all");
  cmd->add_option("--backend", o.backend,
                  "gloo, gloo+shm (same-host float all-reduce in shared memory), or mpi (under mpirun)")
      ->check(CLI::IsMember({"gloo", "gloo+shm", "mpi"}));
  cmd->add_option("--nproc", o.nproc, "ranks to start when not already launched")->check(at_least_one());
  cmd->add_option("--sizes", comm.sizes, "MIN:MAX bytes, e.g. 4:256M (default 4:64M)");
  cmd->add_option("--step-factor", o.step_factor, "multiply the size by this each row");
  cmd->add_option("--iters", o.iters, "timed iterations per size, fewer for large sizes (default: about 0.3 s per size, 3 to 10000)");
  cmd->add_option("--warmup", o.warmup, "untimed iterations per size");
  cmd->add_option("--piece-bytes", o.piece_bytes,
                  "ring all-reduce: bytes per pipelined piece (default 1 MiB; 0: whole chunks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", o.dtype, "float, double, half, bfloat16, int8, uint8, int32, int64");
  cmd->add_option("--redop", o.redop, "sum, avg, min, max, prod");
  cmd->add_option("--root", o.root, "root rank of rooted collectives");
  cmd->add_option("--timeout", o.timeout_s, "seconds before a collective counts as failed");
  cmd->add_option("--json", o.json, "also write the rows as JSON to this file");
  cmd->add_option("--algo", o.algo, "builtin (the back end's), ring, tree, hd, hierarchical, auto (cost model)");
  cmd->add_option("--group-size", o.group_size, "ranks per group for --algo hierarchical");
  cmd->add_option("--encrypt", o.encrypt,
                  "off, or all: every message sealed (comm.encrypt; the ranks need CROSSTRAIN_SECRET)")
      ->check(CLI::IsMember({"off", "all", "wan", "auto"}));
  cmd->add_option("--compression", o.compression,
                  "all-reduce through a codec: none, bf16, fp16, int8, int4, topk:F, powersgd:R");
}

int run_bench_comm(BenchCommCli& comm, const std::vector<std::string>& args) {
  if (!comm.sizes.empty()) apps::parse_sizes(comm.sizes, comm.options.min_bytes, comm.options.max_bytes);
  return apps::bench_comm(comm.options, args);
}

// `crosstrain bench cost-model`.
struct BenchCostModelCli {
  CLI::App* cmd = nullptr;
  apps::BenchCostModelOptions options;
};

void add_bench_cost_model_command(CLI::App& bench, BenchCostModelCli& model) {
  apps::BenchCostModelOptions& o = model.options;
  CLI::App* cmd = model.cmd = bench.add_subcommand(
      "cost-model", "cost model's predicted time next to the measured one (ring, tree, hd; all-reduce by default)");
  cmd->add_option("--nproc", o.nproc, "ranks to start when not already launched")->check(at_least_one());
  cmd->add_option("--topology", o.topology, "links from this topology file instead of calibrating them")
      ->check(CLI::ExistingFile);
  cmd->add_option("--repeat", o.repeat, "calibrate-and-measure repetitions (the table shows medians)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--timeout", o.timeout_s, "seconds before a collective counts as failed");
  cmd->add_option("--op", o.op, "allreduce, reducescatter, allgather, broadcast, or all")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "allgather", "broadcast", "all"}));
  cmd->add_option("--backend", o.backend, "gloo, or mpi (under mpirun)")->check(CLI::IsMember({"gloo", "mpi"}));
}

// `crosstrain bench seal`.
struct BenchSealCli {
  CLI::App* cmd = nullptr;
  apps::BenchSealOptions options;
};

void add_bench_seal_command(CLI::App& bench, BenchSealCli& seal) {
  seal.cmd = bench.add_subcommand("seal", "AEAD rate of one core for the sealed data plane (comm.encrypt)");
  seal.cmd->add_option("--bytes", seal.options.message_bytes, "message size")->check(CLI::PositiveNumber);
  seal.cmd->add_option("--seconds", seal.options.seconds, "time per cipher and direction")->check(CLI::PositiveNumber);
}

// `crosstrain bench attention`.
struct BenchAttentionCli {
  CLI::App* cmd = nullptr;
  apps::BenchAttentionOptions options;
};

void add_bench_attention_command(CLI::App& bench, BenchAttentionCli& attention) {
  apps::BenchAttentionOptions& o = attention.options;
  CLI::App* cmd = attention.cmd = bench.add_subcommand(
      "attention", "fused causal attention against the dense path, forward+backward, at several lengths");
  cmd->add_option("--lengths", o.lengths, "sequence lengths (repeatable; default 128 512 1024 2048)");
  cmd->add_option("--batch", o.batch, "sequences")->check(CLI::PositiveNumber);
  cmd->add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", o.head_dim, "width of one head")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", o.repeat, "timed repetitions (the table shows medians)")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o.threads, "compute threads")->check(CLI::PositiveNumber);
}

// `crosstrain bench pipeline`.
struct BenchPipelineCli {
  CLI::App* cmd = nullptr;
  apps::BenchPipelineOptions options;
  std::string stages, microbatches;
};

void add_bench_pipeline_command(CLI::App& bench, BenchPipelineCli& pipe) {
  apps::BenchPipelineOptions& o = pipe.options;
  CLI::App* cmd = pipe.cmd =
      bench.add_subcommand("pipeline", "pipeline bubble of each schedule, measured against theory");
  cmd->add_option("--stages", pipe.stages, "pipeline depths, e.g. 2,4 (default 2,4)");
  cmd->add_option("--microbatches", pipe.microbatches, "micro-batch counts, e.g. 4,8 (default 4,8)");
  cmd->add_option("--schedule", o.schedules, "gpipe, 1f1b, interleaved, zb-h1, zb-h2 (repeatable; default all)");
  cmd->add_option("--layers", o.layers, "GPT layers");
  cmd->add_option("--width", o.width, "GPT width");
  cmd->add_option("--context", o.context, "sequence length");
  cmd->add_option("--batch", o.batch, "sequences per micro-batch");
  cmd->add_option("--steps", o.steps, "timed steps per measurement");
  cmd->add_option("--trace", o.trace_dir, "write a Chrome/Perfetto trace of each run into this folder");
}

// "2,4" into {2, 4}; an empty text leaves `out` (the default) as it is.
void parse_int_list(const std::string& text, std::vector<int>& out) {
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
}

int run_bench_pipeline(BenchPipelineCli& pipe, const std::vector<std::string>& args) {
  parse_int_list(pipe.stages, pipe.options.stages);
  parse_int_list(pipe.microbatches, pipe.options.microbatches);
  return apps::bench_pipeline(pipe.options, args);
}

// `crosstrain train`.
struct TrainCli {
  CLI::App* cmd = nullptr;
  apps::TrainCommand options;
};

void add_train_command(CLI::App& app, TrainCli& train) {
  apps::TrainCommand& o = train.options;
  train.cmd = app.add_subcommand("train", "train a model from a TOML recipe");
  train.cmd->add_option("config", o.config_path, "recipe, e.g. recipes/gpt-tiny.toml")->required();
  train.cmd->add_option("--nproc", o.nproc, "ranks to start when not already launched")->check(at_least_one());
  train.cmd->add_option("--set", o.sets, "override a key: --set train.steps=30 (repeatable)");
  train.cmd->add_flag("--resume", o.resume, "continue from the newest checkpoint in run.dir");
  train.cmd->add_option("--max-restarts", o.max_restarts,
                        "elastic training: restart failed ranks up to N times in all (elastic.max_restarts)")
      ->check(CLI::NonNegativeNumber);
}

// `crosstrain config`.
struct ConfigCli {
  CLI::App* cmd = nullptr;
  apps::ConfigCommand options;
};

void add_config_command(CLI::App& app, ConfigCli& config) {
  apps::ConfigCommand& o = config.options;
  config.cmd = app.add_subcommand("config", "print the config a run would get: every key, what it takes, its "
                                            "default, and notices; trains nothing");
  config.cmd->add_option("recipe", o.recipe, "recipe, e.g. recipes/gpt-tiny.toml (default: none, the defaults)");
  config.cmd->add_option("--set", o.sets, "override a key: --set train.steps=30 (repeatable)");
  config.cmd->add_option("--nproc", o.nproc, "also check it for this many ranks and print the layout (default: 0, "
                                             "no check)")
      ->check(CLI::NonNegativeNumber);
  config.cmd->add_flag("--reference", o.reference, "print every key's type, default and help as Markdown (the page "
                                                    "docs/config-reference.md)");
}

// `crosstrain demo`.
struct DemoCli {
  CLI::App* cmd = nullptr;
  int nproc = 2;
};

void add_demo_command(CLI::App& app, DemoCli& demo) {
  demo.cmd = app.add_subcommand("demo", "a short tour of the collectives on local ranks");
  demo.cmd->add_option("--nproc", demo.nproc, "ranks to start")->check(at_least_one());
}

// `crosstrain ckpt info|export`.
struct CkptCli {
  CLI::App* info = nullptr;
  CLI::App* export_cmd = nullptr;
  std::string path, output, out, format = "plain", max_shard_size = "5GB";
  bool tensors = false, optimizer = false, verify = false;
};

void add_ckpt_command(CLI::App& app, CkptCli& ckpt) {
  auto* cmd = app.add_subcommand("ckpt", "inspect and export distributed checkpoints");
  cmd->require_subcommand(1);
  ckpt.info = cmd->add_subcommand("info", "summary of a checkpoint (or of a run directory's newest)");
  ckpt.info->add_option("path", ckpt.path, "checkpoint or run directory")->required();
  ckpt.info->add_flag("--tensors", ckpt.tensors, "list every tensor with its shape and how it is stored");
  ckpt.info->add_flag("--verify", ckpt.verify, "also read every piece and check its checksum (sizes are always checked)");
  ckpt.export_cmd = cmd->add_subcommand("export", "write one safetensors file with plain names, or (--format hf) a "
                                       "Hugging Face model directory");
  ckpt.export_cmd->add_option("path", ckpt.path, "checkpoint or run directory (--format hf: or a Hugging Face directory)")
      ->required();
  ckpt.export_cmd->add_option("output", ckpt.output, "output .safetensors file (plain) or directory (hf)");
  ckpt.export_cmd->add_option("--out", ckpt.out, "the output, instead of the positional argument");
  ckpt.export_cmd->add_option("--format", ckpt.format, "plain (crosstrain names, one file) or hf (config.json + "
                              "model.safetensors as transformers reads them; docs/huggingface.md)")
      ->check(CLI::IsMember({"plain", "hf"}));
  ckpt.export_cmd->add_option("--max-shard-size", ckpt.max_shard_size,
                              "hf: split the weights into files of at most this size (5GB = 5e9 bytes, 2GiB, 4096)");
  ckpt.export_cmd->add_flag("--optimizer", ckpt.optimizer, "plain: also export the Adam moments");
}

// `crosstrain report` and `crosstrain trace merge`.
struct ReportCli {
  CLI::App* report = nullptr;
  CLI::App* trace_merge = nullptr;
  std::string run_dir, out;
};

void add_report_commands(CLI::App& app, ReportCli& cli) {
  cli.report = app.add_subcommand("report", "HTML run report (charts, per-rank time, stragglers) and a summary");
  cli.report->add_option("run_dir", cli.run_dir, "run directory (run.dir)")->required();
  cli.report->add_option("--out", cli.out, "HTML file to write (default RUN_DIR/report.html)");
  auto* trace = app.add_subcommand("trace", "work with the ranks' traces (run.dir/traces)");
  trace->require_subcommand(1);
  cli.trace_merge = trace->add_subcommand("merge", "one timeline on rank 0's clock: RUN_DIR/traces/merged.json");
  cli.trace_merge->add_option("run_dir", cli.run_dir, "run directory (run.dir)")->required();
}

// `crosstrain plan` and `crosstrain sim`: the same inputs.
struct PlanCli {
  CLI::App* plan = nullptr;
  CLI::App* sim = nullptr;
  apps::PlanCommand options;
};

void add_plan_inputs(CLI::App* cmd, apps::PlanCommand& o) {
  cmd->add_option("model", o.model, "preset (gpt2, gpt3-175b, llama-7b, ...) or recipe (.toml)");
  cmd->add_option("cluster", o.cluster, "cluster file (clusters/*.toml, or one written by --calibrate)");
  cmd->add_option("--layout", o.layout, "for a preset: \"dp=8 tp=8 pp=16 zero=1 1f1b m=192 mb=1 recompute=full\"");
  cmd->add_option("--set", o.sets, "for a recipe: override a key as crosstrain train does (repeatable)");
  cmd->add_option("--nproc", o.nproc, "for a recipe: ranks of the run (default: every device)")->check(at_least_one());
  cmd->add_option("--global-batch", o.global_batch, "sequences per step (presets)")->check(at_least_one());
  cmd->add_option("--tokens", o.tokens, "training tokens: time-to-train, cost, energy (e.g. 300e9)")
      ->check(CLI::NonNegativeNumber);
}

void add_plan_commands(CLI::App& app, PlanCli& cli) {
  apps::PlanCommand& o = cli.options;
  cli.plan = app.add_subcommand("plan", "time, memory, cost, energy and wall of a layout; --search for the best");
  add_plan_inputs(cli.plan, o);
  cli.plan->add_flag("--search", o.search, "search layouts (dp x tp x pp x ZeRO x micro-batches x schedule x sync)");
  cli.plan->add_option("--top", o.top, "layouts the search prints")->check(at_least_one());
  cli.plan->add_option("--rank-by", o.rank_by, "time or cost")->check(CLI::IsMember({"time", "cost"}));
  cli.plan->add_option("--devices", o.devices, "search: devices to use (default all)")->check(at_least_one());
  cli.plan->add_flag("--json", o.json, "print JSON");
  cli.plan->add_flag("--calibrate", o.calibrate, "measure this host and write a cluster file (--out)");
  cli.plan->add_option("--out", o.out, "--calibrate: the cluster file to write");
  cli.sim = app.add_subcommand("sim", "discrete-event replay of one step of a layout; writes a Perfetto trace");
  add_plan_inputs(cli.sim, o);
  cli.sim->add_option("--trace", o.trace, "trace file to write (default sim-trace.json)");
  cli.sim->add_flag("--json", o.json, "print JSON");
}

// `crosstrain tokenize`.
struct TokenizeCli {
  CLI::App* cmd = nullptr;
  apps::TokenizeOptions options;
};

void add_tokenize_command(CLI::App& app, TokenizeCli& cli) {
  apps::TokenizeOptions& o = cli.options;
  cli.cmd = app.add_subcommand("tokenize", "train a SentencePiece tokenizer on a text corpus and write a token file");
  cli.cmd->add_option("corpus", o.corpus, "text file or folder of text files")->required();
  cli.cmd->add_option("--out", o.out, "folder for train.bin, meta.json and the tokenizer")->required();
  cli.cmd->add_option("--vocab-size", o.vocab_size, "pieces of the SentencePiece model to train")->check(at_least_one());
  cli.cmd->add_option("--type", o.type, "SentencePiece model: bpe or unigram")->check(CLI::IsMember({"bpe", "unigram"}));
  cli.cmd->add_option("--tokenizer", o.tokenizer,
                      "use this tokenizer instead of training one: a .model, a tokenizer.json, vocab.json (+ merges.txt) "
                      "or a folder with one");
  cli.cmd->add_option("--threads", o.threads, "encoding threads (default: one per core)")->check(at_least_one());
  cli.cmd->add_option("--val-fraction", o.val_fraction, "the last lines, this fraction of the bytes, go to val.bin");
}

// Every command with its options, declared in the order `crosstrain --help` lists them.
struct CommandLine {
  CLI::App app{"crosstrain: train large neural networks across devices, machines and clusters"};
  RunCli run;
  BenchCommCli bench_comm;
  BenchCostModelCli bench_cost_model;
  BenchPipelineCli bench_pipeline;
  BenchAttentionCli bench_attention;
  BenchSealCli bench_seal;
  apps::BenchSchedulerCli bench_scheduler;
  TrainCli train;
  ConfigCli config;
  DemoCli demo;
  CkptCli ckpt;
  ReportCli report;
  PlanCli plan;
  TokenizeCli tokenize;
  apps::LedgerCli ledger;
  apps::KeysCli keys;
  apps::SchedulerCli scheduler;

  CommandLine() {
    app.require_subcommand(1);
    // Every option's --help line shows its default (subcommands inherit this from the app).
    app.option_defaults()->always_capture_default();
    // What it is and what it runs on today: libtorch on CPUs, Gloo and MPI between processes (no CUDA/NCCL yet).
    app.set_version_flag("--version", std::string("crosstrain ") + CROSSTRAIN_VERSION + " (libtorch " +
                                          TORCH_VERSION + ", CPU; Gloo and MPI back ends)");
    add_run_command(app, run);
    auto* bench = app.add_subcommand("bench", "benchmarks");
    bench->require_subcommand(1);
    add_bench_comm_command(*bench, bench_comm);
    add_bench_cost_model_command(*bench, bench_cost_model);
    add_bench_pipeline_command(*bench, bench_pipeline);
    add_bench_attention_command(*bench, bench_attention);
    add_bench_seal_command(*bench, bench_seal);
    apps::add_bench_scheduler_command(*bench, bench_scheduler);
    add_train_command(app, train);
    add_config_command(app, config);
    add_demo_command(app, demo);
    add_ckpt_command(app, ckpt);
    add_report_commands(app, report);
    add_plan_commands(app, plan);
    add_tokenize_command(app, tokenize);
    apps::add_ledger_command(app, ledger);
    apps::add_keys_command(app, keys);
    apps::add_scheduler_commands(app, scheduler);
  }
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;
};

bool is_command(const CLI::App& app, const std::string& name) {
  for (const auto* sub : app.get_subcommands({}))
    if (sub->check_name(name)) return true;
  return false;
}

// Parses argv into `cli`. Returns the exit code when there is nothing to run (--help, or a usage error, reported
// on one line), or nothing when the chosen command should run.
std::optional<int> parse_command_line(CommandLine& cli, int argc, char** argv, const std::vector<std::string>& args) {
  if (!args.empty() && args[0].rfind("-", 0) != 0 && !is_command(cli.app, args[0])) {
    std::cerr << "crosstrain: unknown command '" << args[0]
              << "'; the commands are train, config, run, bench, plan, sim, ckpt, report, trace, tokenize, ledger, keys, scheduler, job, demo (crosstrain --help)" << std::endl;
    return 2;
  }
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return cli.app.exit(e);  // --help
    // One line, with the way to the help.
    std::cerr << "crosstrain: " << apps::error_line(e.what(), e.get_name()) << " (crosstrain --help)" << std::endl;
    return e.get_exit_code();
  }
  return std::nullopt;
}

// Runs the command the command line chose. Returns its exit code.
int run_command(CommandLine& cli, const std::vector<std::string>& args) {
  if (*cli.run.cmd) return run_launcher(cli.run);
  if (*cli.bench_cost_model.cmd) return apps::bench_cost_model(cli.bench_cost_model.options, args);
  if (*cli.bench_comm.cmd) return run_bench_comm(cli.bench_comm, args);
  if (*cli.demo.cmd) return apps::demo_comm(cli.demo.nproc, args);
  if (*cli.bench_pipeline.cmd) return run_bench_pipeline(cli.bench_pipeline, args);
  if (*cli.bench_attention.cmd) return apps::bench_attention(cli.bench_attention.options);
  if (*cli.bench_seal.cmd) return apps::bench_seal(cli.bench_seal.options);
  if (*cli.bench_scheduler.cmd) return apps::bench_scheduler(cli.bench_scheduler);
  if (*cli.train.cmd) return apps::train_command(cli.train.options, args);
  if (*cli.config.cmd) return apps::config_command(cli.config.options);
  if (*cli.ckpt.info) return apps::ckpt_info(cli.ckpt.path, cli.ckpt.tensors, cli.ckpt.verify);
  if (*cli.ckpt.export_cmd) {
    const std::string output = cli.ckpt.out.empty() ? cli.ckpt.output : cli.ckpt.out;
    if (output.empty()) throw UsageError("ckpt export: give the output (a file, or with --format hf a directory) or --out");
    if (cli.ckpt.format == "hf" && cli.ckpt.optimizer)
      throw UsageError("ckpt export: --optimizer belongs to --format plain (Hugging Face's layout holds weights only)");
    if (cli.ckpt.format == "hf") return apps::ckpt_export_hf(cli.ckpt.path, output, cli.ckpt.max_shard_size);
    return apps::ckpt_export(cli.ckpt.path, output, cli.ckpt.optimizer);
  }
  if (*cli.report.report) return apps::report_command(cli.report.run_dir, cli.report.out);
  if (*cli.report.trace_merge) return apps::trace_merge_command(cli.report.run_dir);
  if (*cli.plan.plan) return apps::plan_command(cli.plan.options);
  if (*cli.plan.sim) return apps::sim_command(cli.plan.options);
  if (*cli.tokenize.cmd) return apps::tokenize_command(cli.tokenize.options);
  if (cli.ledger.selected()) return apps::run_ledger_command(cli.ledger);
  if (cli.keys.selected()) return apps::run_keys_command(cli.keys);
  if (cli.scheduler.selected()) return apps::run_scheduler_command(cli.scheduler);
  return 0;
}

// run_command, with a failure as one line on stderr: exit code 2 for bad input, 1 for anything else.
int run_reporting_errors(CommandLine& cli, const std::vector<std::string>& args) {
  try {
    return run_command(cli, args);
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
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  CommandLine cli;
  if (std::optional<int> exit_code = parse_command_line(cli, argc, argv, args)) return *exit_code;
  return run_reporting_errors(cli, args);
}
