#include "crosstrain/scheduler/train_share.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/core/names.h"
#include "crosstrain/planner/layout.h"

namespace crosstrain::scheduler {
namespace fs = std::filesystem;

namespace {

bool uneven_shares(const PlacementRecord& placement) {
  for (const ClusterShare& s : placement.shares)
    if (s.ranks != placement.shares.front().ranks) return true;
  return false;
}

// Every node of a placement, in order: its ranks, and each share's first node.
struct PlacedNodes {
  std::vector<int> sizes, first;
  int of_share(size_t share) const {
    return (share + 1 < first.size() ? first[share + 1] : static_cast<int>(sizes.size())) - first[share];
  }
};

PlacedNodes placed_nodes(const PlacementRecord& placement, const TrainLaunch& launch) {
  PlacedNodes nodes;
  for (const ClusterShare& s : placement.shares) {
    nodes.first.push_back(static_cast<int>(nodes.sizes.size()));
    const auto per = launch.devices_per_node.find(s.cluster);
    for (int size : share_node_sizes(s.ranks, per == launch.devices_per_node.end() ? 0 : per->second))
      nodes.sizes.push_back(size);
  }
  return nodes;
}

std::string joined(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

std::string share_sizes(const PlacementRecord& placement) {
  std::vector<int> ranks;
  for (const ClusterShare& s : placement.shares) ranks.push_back(s.ranks);
  return joined(ranks);
}

// The layout a placement runs: the whole job's (tp and pp are the same inside every cluster; data parallelism spans
// them), with the placement's sync across clusters. One cluster keeps its recipe's own sync mode.
planner::Layout placed_layout(const PlacementRecord& placement, bool work_log) {
  const std::string& text = placement.layout.empty() ? placement.shares.front().layout : placement.layout;
  planner::Layout l = planner::parse_layout(text);
  const bool spans = placement.shares.size() > 1;
  l.sync = spans ? placement.sync : planner::LayoutSync::Sync;
  l.inner_steps = spans ? placement.inner_steps : 1;
  // The work log digests each rank's whole local gradient, which ZeRO-2 and -3 never hold: at most ZeRO-1.
  if (work_log) l.zero = std::min(l.zero, 1);
  // Clusters of different sizes average whole parameters between them (their leaders do), which ZeRO shards.
  if (l.sync == planner::LayoutSync::DiLoCo && uneven_shares(placement)) l.zero = 0;
  return l;
}

// Every choice of the planner's layout as `crosstrain train --set` overrides (shape, micro-batches, precision,
// recompute, buckets, stages, sync across clusters), but the job's own batch.
std::vector<std::string> layout_overrides(const JobRecord& job, const PlacementRecord& placement, bool work_log) {
  const planner::Layout layout = placed_layout(placement, work_log);
  std::vector<std::string> sets;
  for (const std::string& s : layout.train_overrides(planner::OverrideScope::WholeRun)) {
    // The job's own batch; plain sync is the recipe's to choose (its own mode for one cluster).
    const bool own = s.rfind("train.global_batch=", 0) == 0 || s == "sync.mode=sync";
    // An elastic job's clusters come and go: every live one keeps its ranks' even share instead.
    const bool per_cluster = s.rfind("sync.cluster_batch=", 0) == 0 && placement.live_elastic();
    if (!own && !per_cluster) sets.push_back(s);
  }
  sets.push_back("train.global_batch=" + std::to_string(job.spec.batch()));
  if (layout.sync == planner::LayoutSync::DiLoCo && uneven_shares(placement))
    sets.push_back("sync.cluster_ranks=" + share_sizes(placement));
  return sets;
}

// The scheduler's decisions as `crosstrain train --set` overrides: the job's own steps and batch, then the layout
// through the planner's bridge (the same keys `crosstrain plan` prints for it).
std::vector<std::string> placement_overrides(const JobRecord& job, const PlacementRecord& placement,
                                             const TrainLaunch& launch) {
  const bool work_log = !launch.ledger.empty();
  std::vector<std::string> sets{
      "run.dir=" + launch.run_dir,
      "train.steps=" + std::to_string(job.spec.steps),
      "train.checkpoint_every=" + std::to_string(job.spec.checkpoint_every),
      "obs.metrics_host=127.0.0.1",
      "run.fence=" + placement_fence(job, placement),
  };
  const std::vector<std::string> layout = layout_overrides(job, placement, work_log);
  sets.insert(sets.end(), layout.begin(), layout.end());
  if (work_log) sets.push_back("run.work_log=true");
  if (!launch.site.empty()) sets.push_back("run.site=" + launch.site);
  // Elastic across clusters: each cluster is a unit of churn, the job trains on while one is left.
  if (placement.live_elastic()) {
    sets.push_back("sync.clusters=" + std::to_string(placement.shares.size()));
    sets.push_back("elastic.min_replicas=1");
  }
  return sets;
}

}  // namespace

std::string share_recipe_path(const JobRecord& job, const TrainLaunch& launch) {
  if (job.spec.recipe_text.empty()) return job.spec.recipe;
  const std::string name = fs::path(job.spec.recipe).filename().string();
  return (fs::path(launch.run_dir) / "recipe" / (is_valid_name(name) ? name : "recipe.toml")).string();
}

std::vector<int> share_node_sizes(int ranks, int per_node) {
  if (per_node <= 0 || ranks <= per_node) return {ranks};
  std::vector<int> sizes;
  for (int left = ranks; left > 0; left -= per_node) sizes.push_back(std::min(per_node, left));
  return sizes;
}

std::vector<std::string> train_share_argv(const JobRecord& job, const PlacementRecord& placement, size_t share,
                                          const TrainLaunch& launch, int node) {
  if (job.spec.recipe.empty())
    throw UsageError("job " + std::to_string(job.id) + " has no recipe: submit it with --recipe FILE to run it");
  if (share >= placement.shares.size()) throw UsageError("share " + std::to_string(share) + " is not in the placement");
  const PlacedNodes nodes = placed_nodes(placement, launch);
  if (node != kNodeFromSlurm && (node < 0 || node >= nodes.of_share(share)))
    throw UsageError("share " + std::to_string(share) + " has no node " + std::to_string(node));
  const auto total = std::to_string(nodes.sizes.size());
  // On a share of several nodes the script fills in each node's size and number (train_share_script).
  const bool from_slurm = node == kNodeFromSlurm;
  const std::string nproc = from_slurm ? "@NPROC@" : std::to_string(nodes.sizes[nodes.first[share] + node]);
  const std::string node_rank = from_slurm ? "@NODE_RANK@" : std::to_string(nodes.first[share] + node);
  // A live-elastic job (placement.live_elastic()) runs its launchers elastic: it starts once every share is there
  // (--nnodes N:N: a share that comes up first does not train, and write the run's first outputs at its site,
  // alone), trains on without a lost one (elastic.min_replicas = 1), and a share started again joins it; the
  // launcher restarts a share's failed ranks itself too.
  const bool elastic = placement.live_elastic();
  std::vector<std::string> argv{launch.crosstrain, "run", "--nproc", nproc, "--nnodes",
                                elastic ? total + ":" + total : total, "--node-rank", node_rank,
                                "--timeout", std::to_string(launch.rendezvous_timeout_s)};
  if (elastic) argv.insert(argv.end(), {"--max-restarts", std::to_string(launch.rank_restarts)});
  if (std::any_of(nodes.sizes.begin(), nodes.sizes.end(), [&](int n) { return n != nodes.sizes.front(); }))
    argv.insert(argv.end(), {"--node-sizes", joined(nodes.sizes)});
  if (nodes.sizes.size() > 1) {
    if (launch.master_port <= 0) throw UsageError("a job across nodes needs a rendezvous port (TrainLaunch::master_port)");
    const auto host_of = [&](size_t s) {
      const auto host = launch.cluster_hosts.find(placement.shares[s].cluster);
      return host == launch.cluster_hosts.end() ? launch.master_host : host->second;
    };
    // With a standby on share 1's first node (node 1), share 0's loss moves the job's store there. A share started
    // later still names node 0's store: its launcher joins whichever of the two holds the job (the scheduler cannot
    // know that the standby took over); share 0 itself comes back into the standby's with --rejoin.
    const bool standby = elastic && placement.standby;
    if (standby && launch.standby_port <= 0)
      throw UsageError("a job with a standby store needs its port (TrainLaunch::standby_port)");
    const std::string standby_at = standby ? host_of(1) + ":" + std::to_string(launch.standby_port) : "";
    const bool rejoin = standby && placement.rendezvous_moved && share == 0;
    const std::string master = rejoin ? standby_at : host_of(0) + ":" + std::to_string(launch.master_port);
    argv.insert(argv.end(), {"--master", master, "--cluster", std::to_string(share)});
    if (standby) argv.insert(argv.end(), {"--standby", standby_at});
    if (rejoin) argv.push_back("--rejoin");
  }
  argv.insert(argv.end(), {"--", launch.crosstrain, "train", share_recipe_path(job, launch)});
  // The job's own overrides first: the scheduler's come after them and win (state_store.h refuses job overrides of
  // the keys it owns; this holds for specs stored before that check too).
  for (const std::string& s : job.spec.overrides) argv.insert(argv.end(), {"--set", s});
  for (const std::string& s : placement_overrides(job, placement, launch)) argv.insert(argv.end(), {"--set", s});
  // With the clusters' keys at hand, each share also proves its cluster in the groups it seals (comm.identity).
  if (!launch.ledger_keys.empty()) {
    const fs::path keys(launch.ledger_keys);
    argv.insert(argv.end(), {"--set", "comm.identity=" + (keys / (placement.shares[share].cluster + ".key")).string(),
                             "--set", "comm.peer_keys=" + (keys / "keys.json").string()});
  }
  if (launch.resume) argv.push_back("--resume");
  return argv;
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& a : argv) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += (line.empty() ? "" : " ") + q + "'";
  }
  return line;
}

// The job's rendezvous is on share 0's first node, at its cluster's address (--cluster-host): on a share of several
// nodes, the node that holds that address is its node 0 and the others follow in Slurm's order (k: the node's place
// in the share). Slurm's node at the address is found by its NodeAddr; the executor puts it in the allocation.
std::string share_node_number(const std::string& rendezvous) {
  const std::string addr = shell_line({"NodeAddr=" + rendezvous});
  return "m=-1; i=0; name=$(scontrol show node -o | awk -v a=" + addr +
         " '{for (f = 1; f <= NF; f++) if ($f == a) {sub(\"NodeName=\", \"\", $1); print $1}}'); "
         "for h in $(scontrol show hostnames \"$SLURM_JOB_NODELIST\"); do [ \"$h\" = \"$name\" ] && m=$i; "
         "i=$((i + 1)); done; [ \"$m\" -ge 0 ] || { echo \"the job's rendezvous address \"" + shell_line({rendezvous}) +
         "\" is no node of this share (--cluster-host)\" >&2; exit 2; }; "
         "if [ \"$SLURM_NODEID\" -eq \"$m\" ]; then k=0; elif [ \"$SLURM_NODEID\" -lt \"$m\" ]; then "
         "k=$((SLURM_NODEID + 1)); else k=$SLURM_NODEID; fi; ";
}

// A share over several nodes: srun starts one launcher on each node of the allocation, which takes its node's size
// and number from its place in the share (share_node_number for share 0, else SLURM_NODEID).
std::string launchers_on_each_node(const JobRecord& job, const PlacementRecord& placement, size_t share,
                                   const TrainLaunch& launch) {
  const PlacedNodes nodes = placed_nodes(placement, launch);
  const int count = nodes.of_share(share), first = nodes.first[share];
  std::string line = shell_line(train_share_argv(job, placement, share, launch, kNodeFromSlurm));
  for (const auto& [mark, value] : {std::pair<std::string, std::string>{"'@NPROC@'", "\"$n\""},
                                    std::pair<std::string, std::string>{"'@NODE_RANK@'", "\"$node\""}})
    line.replace(line.find(mark), mark.size(), value);
  std::string sizes;
  for (int i = 0; i < count; ++i) sizes += std::to_string(i) + ") n=" + std::to_string(nodes.sizes[first + i]) + ";; ";
  const auto host = launch.cluster_hosts.find(placement.shares[share].cluster);
  // Share 0's node 0 hosts the job's store, and share 1's the standby's where there is one.
  const bool hosts_rendezvous = ((share == 0 && !placement.rendezvous_moved) || (share == 1 && placement.standby)) &&
                                host != launch.cluster_hosts.end();
  const std::string each = (hosts_rendezvous ? share_node_number(host->second) : "k=$SLURM_NODEID; ") +
                           "node=$((" + std::to_string(first) + " + k)); case \"$k\" in " + sizes +
                           "*) echo \"no node $k in this share\" >&2; exit 2;; esac; exec " + line;
  const std::string n = std::to_string(count);
  return shell_line({"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--kill-on-bad-exit=1", "sh", "-c",
                     each});
}

// The recipe as submitted, written at the share's site before its launchers start (base64: any text is one quoted
// word); a temporary name and a rename, as the share's other nodes may read it at once.
std::string write_recipe_line(const JobRecord& job, const TrainLaunch& launch) {
  const std::string& text = job.spec.recipe_text;
  std::string b64(sodium_base64_encoded_len(text.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(b64.data(), b64.size(), reinterpret_cast<const unsigned char*>(text.data()), text.size(),
                    sodium_base64_VARIANT_ORIGINAL);
  b64.resize(std::strlen(b64.c_str()));
  const std::string path = shell_line({share_recipe_path(job, launch)});
  return "mkdir -p " + shell_line({fs::path(share_recipe_path(job, launch)).parent_path().string()}) +
         " && printf '%s' " + shell_line({b64}) + " | base64 -d > " + path + ".tmp$$ && mv " + path + ".tmp$$ " +
         path + " || exit 1\n";
}

std::string train_share_script(const JobRecord& job, const PlacementRecord& placement, size_t share,
                               const TrainLaunch& launch) {
  // The recipe first: a share that cannot write it ends there, before anything runs in the background.
  const std::string recipe = job.spec.recipe_text.empty() ? "" : write_recipe_line(job, launch);
  const std::string train = placed_nodes(placement, launch).of_share(share) > 1
                                ? launchers_on_each_node(job, placement, share, launch)
                                : shell_line(train_share_argv(job, placement, share, launch));
  if (launch.ledger.empty()) return recipe + train;
  const std::string& cluster = placement.shares[share].cluster;
  const std::string claim =
      shell_line({launch.crosstrain, "ledger", "claim", launch.ledger_url.empty() ? launch.ledger : launch.ledger_url,
                  "--run-dir", launch.run_dir, "--cluster", cluster,
                  "--work-log", work_log_name(placement, share), "--key",
                  (fs::path(launch.ledger_keys) / (cluster + ".key")).string(), "--job", ledger_job(job, placement),
                  "--keys", (fs::path(launch.ledger_keys) / "keys.json").string()}) +
      (launch.ledger_ca.empty() || launch.ledger_url.empty() ? "" : " --ca-cert " + shell_line({launch.ledger_ca}));
  // Claims while training (a cluster lost mid-run keeps what it claimed) and once more at the end.
  // The last claim is tried a few times: the scheduler may be briefly out of reach (or restarting) at the end.
  return recipe + "(while sleep " + std::to_string(launch.claim_every_s) + "; do " + claim +
         " > /dev/null 2>&1; done) &\n" + "claims=$!\n" + train + "\nstatus=$?\nkill $claims 2>/dev/null\n" +
         "for try in 1 2 3 4 5; do " + claim + " && break; sleep 3; done\nexit $status";
}

int64_t newest_checkpoint_step(const std::string& run_dir) {
  std::error_code ec;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root, ec)) return 0;
  int64_t best = 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos || !fs::exists(e.path() / "manifest.json"))
      continue;
    try {
      best = std::max<int64_t>(best, std::stoll(name.substr(5)));
    } catch (const std::exception&) {
      // not a checkpoint of ours
    }
  }
  return best;
}

int64_t last_metrics_step(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::string line;
  int64_t step = 0;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a last line without its newline may still be being written
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer()) step = row["step"].get<int64_t>();
  }
  return step;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("scheduler: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("scheduler: cannot find a free port for a job's rendezvous");
  return ntohs(addr.sin_port);
}

}  // namespace crosstrain::scheduler

namespace crosstrain::scheduler {

std::string placement_fence(const JobRecord& job, const PlacementRecord& placement) {
  return "job" + std::to_string(job.id) + ".a" + std::to_string(placement.attempt);
}

std::string work_log_name(const PlacementRecord& placement, size_t share) {
  return placement.shares[share].cluster + ".a" + std::to_string(placement.attempt);
}

int64_t job_of_ledger_job(const std::string& name) {
  const size_t attempt = name.rfind(".a"), dash = name.rfind('-', attempt);
  if (attempt == std::string::npos || dash == std::string::npos || dash + 1 >= attempt) return -1;
  const std::string id = name.substr(dash + 1, attempt - dash - 1);
  const std::string n = name.substr(attempt + 2);
  const auto digits = [](const std::string& s) { return !s.empty() && s.size() < 18 && s.find_first_not_of("0123456789") == std::string::npos; };
  return digits(id) && digits(n) ? std::stoll(id) : -1;
}

std::string ledger_job(const JobRecord& job, const PlacementRecord& placement) {
  return job.spec.name + "-" + std::to_string(job.id) + ".a" + std::to_string(placement.attempt);
}

int share_number(const std::string& stem) {
  if (stem.rfind("share", 0) != 0 || stem.size() == 5 || stem.size() > 10 ||
      stem.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;
  return std::stoi(stem.substr(5));
}

std::string job_dir_in(const std::string& work_dir, int64_t job_id) {
  return (fs::path(work_dir) / ("job" + std::to_string(job_id))).string();
}

namespace {

// Where the daemon reads the job's outputs (job_run_dir): written only with sites.
fs::path outputs_pointer(const std::string& work_dir, int64_t job_id) {
  return fs::path(job_dir_in(work_dir, job_id)) / "run_dir";
}

void point_outputs_at(const std::string& work_dir, int64_t job_id, const std::string& run_dir) {
  const fs::path pointer = outputs_pointer(work_dir, job_id);
  fs::create_directories(pointer.parent_path());
  std::ofstream(pointer.string() + ".tmp") << run_dir << "\n";
  fs::rename(pointer.string() + ".tmp", pointer);
}

}  // namespace

std::string job_run_dir(const std::string& work_dir, int64_t job_id) {
  std::ifstream pointer(outputs_pointer(work_dir, job_id));
  std::string recorded;
  if (pointer && std::getline(pointer, recorded) && !recorded.empty()) return recorded;
  return (fs::path(job_dir_in(work_dir, job_id)) / "run").string();
}

std::string site_run_dir(const std::string& work_dir, const std::string& cluster, int64_t job_id) {
  if (!is_valid_name(cluster)) throw UsageError("'" + cluster + "' is not a cluster name");
  return (fs::path(site_dir_of(work_dir, cluster)) / ("job" + std::to_string(job_id)) / "run").string();
}

std::string site_dir_of(const std::string& work_dir, const std::string& cluster) {
  if (!is_valid_name(cluster)) throw UsageError("'" + cluster + "' is not a cluster name");
  return (fs::path(work_dir) / "sites" / cluster).string();
}

std::string share_script(const JobRecord& job, const PlacementRecord& placement, size_t share,
                         const std::string& command, const std::string& exit_stem) {
  int offset = 0;
  for (size_t i = 0; i < share; ++i) offset += placement.shares[i].ranks;
  std::ostringstream script;
  // Names were checked when they came in (a cluster's at its registration); quoted here all the same, as every
  // value a script is built from.
  script << "#!/bin/bash\n"
         << "export CROSSTRAIN_JOB_ID=" << job.id << " CROSSTRAIN_CLUSTER_NAME=" << shell_quote(placement.shares[share].cluster)
         << " CROSSTRAIN_SHARE=" << share << " CROSSTRAIN_SHARES=" << placement.shares.size()
         << " CROSSTRAIN_RANK_OFFSET=" << offset << " CROSSTRAIN_WORLD_SIZE=" << placement.ranks()
         << " CROSSTRAIN_WORK_LOG_NAME=" << shell_quote(work_log_name(placement, share)) << "\n"
         << "(\n" << command << "\n)\n";  // a subshell: even a command that calls exit leaves its status here
  if (!exit_stem.empty())
    script << "echo $? > " << shell_quote(exit_stem + ".exit.tmp") << " && mv " << shell_quote(exit_stem + ".exit.tmp")
           << " " << shell_quote(exit_stem + ".exit") << "\n";
  return script.str();
}

std::string job_secret_file(const std::string& work_dir, int64_t job_id) {
  const fs::path dir = job_dir_in(work_dir, job_id);
  fs::create_directories(dir);
  const std::string path = (dir / "secret").string();
  if (fs::exists(path)) return path;
  if (sodium_init() < 0) throw Error("libsodium failed to initialise (sodium_init)");
  unsigned char raw[32];
  randombytes_buf(raw, sizeof raw);
  char hex[2 * sizeof raw + 1];
  sodium_bin2hex(hex, sizeof hex, raw, sizeof raw);
  sodium_memzero(raw, sizeof raw);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const bool written = fd >= 0 && ::write(fd, hex, 2 * sizeof raw) == static_cast<ssize_t>(2 * sizeof raw);
  if (fd >= 0) ::close(fd);
  sodium_memzero(hex, sizeof hex);
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error("scheduler: cannot write job " + std::to_string(job_id) + "'s secret " + path + ": " +
                std::strerror(errno));
  return path;
}

std::string job_secret(const std::string& work_dir, int64_t job_id) {
  const std::string path = job_secret_file(work_dir, job_id);
  std::ifstream in(path);
  std::string hex;
  if (!(in >> hex) || hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw Error("scheduler: job " + std::to_string(job_id) + "'s secret " + path +
                " is not 64 hex digits; remove it and the job gets a new one when it starts again");
  return hex;
}

// Share 0 is built first whenever a placement starts: it takes fresh ports (the rendezvous, the standby's) and keeps
// them in the job's folder, where the other shares read them, also one started again into the running job later
// (even by a restarted daemon; share 0 itself, once the standby holds the job's store).
PlacementPorts placement_ports(const std::string& work_dir, int64_t job_id, bool fresh) {
  const fs::path file = fs::path(job_dir_in(work_dir, job_id)) / "rendezvous_port";
  PlacementPorts ports;
  if (fresh) {
    ports.rendezvous = free_port();
    do ports.standby = free_port();
    while (ports.standby == ports.rendezvous);
    fs::create_directories(file.parent_path());
    std::ofstream(file.string() + ".tmp") << ports.rendezvous << " " << ports.standby << "\n";
    fs::rename(file.string() + ".tmp", file);
    return ports;
  }
  std::ifstream in(file);
  if (!(in >> ports.rendezvous) || ports.rendezvous <= 0 || ports.rendezvous > 65535)
    throw Error("scheduler: job " + std::to_string(job_id) + " has no rendezvous port recorded in " + file.string() +
                " (its share 0 was never built)");
  if (!(in >> ports.standby) || ports.standby <= 0 || ports.standby > 65535) ports.standby = 0;  // an older record
  return ports;
}

bool job_has_sites(const std::string& work_dir, int64_t job_id) {
  return fs::exists(outputs_pointer(work_dir, job_id));
}

void outputs_follow_store(const std::string& work_dir, int64_t job_id, const PlacementRecord& placement) {
  if (job_has_sites(work_dir, job_id) && placement.shares.size() >= 2)
    point_outputs_at(work_dir, job_id, site_run_dir(work_dir, placement.shares[1].cluster, job_id));
}

std::function<std::string(const JobRecord&, const PlacementRecord&, size_t)> train_share_command(TrainLaunch base,
                                                                                              std::string work_dir) {
  return [base, work_dir](const JobRecord& job, const PlacementRecord& placement, size_t share) {
    TrainLaunch launch = base;
    if (base.sites) {
      launch.site = placement.shares.at(share).cluster;
      launch.run_dir = site_run_dir(work_dir, launch.site, job.id);
      // The job's outputs are read at share 0's site (rank 0 writes them there).
      if (share == 0) point_outputs_at(work_dir, job.id, launch.run_dir);
    } else {
      launch.run_dir = job_run_dir(work_dir, job.id);
    }
    const PlacementPorts ports = placement_ports(work_dir, job.id, share == 0 && !placement.rendezvous_moved);
    launch.master_port = ports.rendezvous;
    launch.standby_port = ports.standby;
    // Before the placement's shares start: an older one still running somewhere can no longer commit. (Every
    // site's folder with sites; this daemon reaches them all here.)
    if (share == 0 || base.sites) write_fence(launch.run_dir, placement_fence(job, placement));
    launch.resume = newest_checkpoint_step(launch.run_dir) > 0;
    job_secret_file(work_dir, job.id);  // the executor gives it to the share (CROSSTRAIN_SECRET)
    return train_share_script(job, placement, share, launch);
  };
}

}  // namespace crosstrain::scheduler
