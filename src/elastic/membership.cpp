#include "crosstrain/elastic/membership.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>

#include "crosstrain/comm/algorithms/communicator.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/comm/backends/shm.h"
#include "crosstrain/comm/secure/encryption.h"
#include "crosstrain/store/auth.h"
#include "crosstrain/elastic/abortable.h"

namespace crosstrain::elastic {
namespace {



std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// A restarted rank may reach the store before the store has noticed that its previous process is gone.
std::shared_ptr<comm::Rendezvous> connect_retrying(const LaunchEnv& env, int rank, comm::Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      return comm::Rendezvous::connect(env.master_addr, env.master_port, rank, env.world_size, timeout,
                                       comm::JobCredentials{env.job_id, env.secret});
    } catch (const CommError& e) {
      const bool taken = e.cause().find("already connected") != std::string::npos;
      if (!taken || std::chrono::steady_clock::now() >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

CommContext membership_context(int rank, const std::string& op, int64_t step = -1) {
  CommContext c;
  c.rank = rank;
  c.op = op;
  c.group = "elastic";
  if (step >= 0) c.step = step;
  return c;
}

}  // namespace

// What the heartbeat and the watcher share with their Membership. They own it together: fail_over leaves threads
// that are stuck on the lost store behind (a dead host answers nothing until the connection's timeout), and they
// end on their own later without touching the Membership, which has moved on.
struct Membership::Background {
  LaunchEnv env;  // the store they talk to
  Timing timing;
  comm::Millis reopen_within{5000};
  std::shared_ptr<std::atomic<int64_t>> latest, failures;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;  // ends the heartbeat's sleep
};

namespace {

// A reply later than the client waits for (a loaded machine) closes that connection, so that the late reply
// cannot answer the next request: the background threads open another one and carry on. False once the store
// cannot be reached: the job is over (or the store lost), and the main thread finds out on its next store call.
// In tries of a second, so that a stop is noticed soon.
template <class Shared>
bool reopen(Shared& b, std::shared_ptr<comm::Rendezvous>& connection) {
  const auto give_up = std::chrono::steady_clock::now() + b.reopen_within;
  while (!b.stop && std::chrono::steady_clock::now() < give_up) {
    try {
      connection = connect_retrying(b.env, -1, comm::Millis(1000));
      return true;
    } catch (const std::exception&) {
    }
  }
  return false;
}

template <class Shared>
void heartbeat_loop(std::shared_ptr<Shared> b, std::shared_ptr<comm::Rendezvous> beat) {
  const auto period = std::chrono::milliseconds(b->timing.heartbeat_ms);
  while (!b->stop) {
    try {
      beat->store()->add(heartbeat_key(b->env.rank), 1);
    } catch (const CommError&) {
      if (!reopen(*b, beat)) return;
      continue;
    } catch (const std::exception&) {
      return;
    }
    // One wake-up per beat (the ranks share their cores: polling for the end every 10 ms cost them 100 a second).
    std::unique_lock<std::mutex> lock(b->mu);
    b->cv.wait_for(lock, period, [&] { return b->stop.load(); });
  }
}

// Waits for each next generation record in turn; a failure generation raises the abort flag at once.
template <class Shared>
void watch_loop(std::shared_ptr<Shared> b, std::shared_ptr<comm::Rendezvous> watch) {
  while (!b->stop) {
    const int64_t next = b->latest->load() + 1;
    try {
      auto& store = *watch->store();
      try {
        store.wait({generation_key(next)}, std::chrono::milliseconds(250));
      } catch (const CommError& e) {
        if (e.timed_out()) continue;  // no new generation yet (or a late reply: the next call finds it closed)
        throw;
      }
      const Generation g = decode_generation(from_bytes(store.get(generation_key(next))));
      if (b->stop) return;  // left behind by fail_over: the record is an old store's
      if (g.failure()) *b->failures = g.id;
      // Only from the id it waited after: a watcher left behind that read an old store's record after fail_over
      // moved `latest` to the standby's numbering must not move it back.
      int64_t expected = next - 1;
      b->latest->compare_exchange_strong(expected, g.id);
    } catch (const CommError&) {
      if (!reopen(*b, watch)) return;
    } catch (const std::exception&) {
      return;  // a record this process cannot read
    }
  }
}

}  // namespace

Membership::Membership(const LaunchEnv& env, MembershipOptions options)
    : env_(env), options_(std::move(options)),
      incarnation_(incarnation_of(host_name(), static_cast<int>(getpid()), unix_ms())) {
  connect_all();
  // No generation published before this process registers can count it: its watcher and its search for a
  // generation start after them (a restarted process that read every old record caught up seconds late on a
  // loaded machine, and all that time did not see a failure that ended its generation).
  *latest_ = latest_published();
  first_candidate_ = latest_->load() + 1;
  // Beat before registering: the coordinator starts watching the heartbeat as soon as it reads the registration.
  beat_->store()->add(heartbeat_key(env_.rank), 1);
  background_ = background();
  start_heartbeat();
  start_watcher();
  register_rank(0, 0, 0);
}

void Membership::connect_all() {
  const comm::Millis timeout = options_.comm.timeout();
  rendezvous_ = connect_retrying(env_, env_.rank, timeout);
  beat_ = connect_retrying(env_, -1, timeout);
  watch_ = connect_retrying(env_, -1, timeout);
}

void Membership::register_rank(int64_t last_generation, int64_t trained_in, int last_members) {
  Registration r;
  r.rank = env_.rank;
  r.replica = options_.replica;
  r.replica_size = options_.replica_size;
  r.incarnation = incarnation_;
  r.timing = options_.timing;
  r.last_generation = last_generation;
  r.trained_in = trained_in;
  r.last_members = last_members;
  rendezvous_->store()->set(registration_key(env_.rank), to_bytes(encode_registration(r)));
  rendezvous_->store()->add(roster_key(), 1);
}

// Stops the heartbeat and the watcher; `wait`: until they ended (else they end by themselves, see Background).
void Membership::stop_threads(bool wait) {
  if (!background_) return;
  {
    std::lock_guard<std::mutex> lock(background_->mu);
    background_->stop = true;
  }
  background_->cv.notify_all();
  for (std::thread* t : {&heartbeat_, &watcher_}) {
    if (!t->joinable()) continue;
    if (wait) t->join();
    else t->detach();
  }
}

Membership::~Membership() { stop_threads(true); }

bool Membership::primary_lost() {
  if (env_.standby_port <= 0 || failed_over_) return false;
  // Two tries of a second each: a store that is only slow (a loaded machine) answers one of them.
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      (void)comm::Rendezvous::connect(env_.master_addr, env_.master_port, -1, env_.world_size, comm::Millis(1000),
                                      comm::JobCredentials{env_.job_id, env_.secret});
      return false;
    } catch (const std::exception&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  return true;
}

void Membership::fail_over(int64_t current, int64_t trained_in, int trained_in_members) {
  const int64_t known = std::max({current, trained_in, latest_->load()});
  // Every wait of the abandoned generations' communicators ends (their predicates read this flag).
  *failure_generation_ = std::max(failure_generation_->load(), known + 1);
  stop_threads(false);  // their connections lead to the lost store: left to end by themselves
  voter_.reset();       // a vote it was casting there is never answered; a new voter connects to the standby
  failed_over_ = true;
  env_.master_addr = env_.standby_addr;
  env_.master_port = env_.standby_port;
  connect_all();
  beat_->store()->add(heartbeat_key(env_.rank), 1);
  background_ = background();
  start_heartbeat();
  register_rank(known, trained_in, trained_in_members);
  const comm::Millis timeout = options_.comm.timeout();
  try {
    rendezvous_->store()->wait({first_generation_key()}, timeout);
  } catch (const CommError& e) {
    if (!e.timed_out()) throw;
    throw CommError(membership_context(env_.rank, "fail over"),
                    "the standby at " + store_address() + " started no generation within " +
                        std::to_string(timeout.count() / 1000) +
                        " s: it takes over only with a majority of the last generation's members (is node 0 still "
                        "up and only this rank cut off from it?)",
                    true);
  }
  const std::string text = get(first_generation_key());
  int64_t first = 0;
  try {
    size_t used = 0;
    first = std::stoll(text, &used);
    if (used != text.size()) first = 0;
  } catch (const std::exception&) {
  }
  if (first <= known)
    throw CommError(membership_context(env_.rank, "fail over"),
                    "the standby's first generation reads '" + text.substr(0, 40) + "', not a generation after " +
                        std::to_string(known));
  first_candidate_ = first;
  *latest_ = first - 1;
  start_watcher();
}

std::shared_ptr<Membership::Background> Membership::background() const {
  auto b = std::make_shared<Background>();
  b->env = env_;
  b->timing = options_.timing;
  b->reopen_within = std::min(options_.comm.timeout(), comm::Millis(5000));
  b->latest = latest_;
  b->failures = failure_generation_;
  return b;
}

void Membership::start_heartbeat() {
  heartbeat_ = std::thread(heartbeat_loop<Background>, background_, beat_);
}

void Membership::start_watcher() { watcher_ = std::thread(watch_loop<Background>, background_, watch_); }

void Membership::finish() {
  rendezvous_->store()->set(done_key(env_.rank), to_bytes("1"));
  rendezvous_->store()->add(roster_key(), 1);
}

bool Membership::accuse(const Generation& g, int member, const std::string& why) {
  if (member < 0 || member >= static_cast<int>(g.ranks.size())) return false;
  Accusation a;
  a.accused = g.ranks[static_cast<size_t>(member)];
  if (a.accused == env_.rank) return false;
  a.incarnation = g.incarnations.at(a.accused);
  a.why = why;
  rendezvous_->store()->set(accusation_key(g.id, env_.rank), to_bytes(encode_accusation(a)));
  rendezvous_->store()->add(accusations_key(), 1);
  return true;
}

std::string Membership::get(const std::string& key) { return from_bytes(rendezvous_->store()->get(key)); }

std::string Membership::wait_get(const std::string& key, std::chrono::milliseconds timeout) {
  rendezvous_->store()->wait({key}, timeout);
  return get(key);
}

int64_t Membership::latest_published() {
  auto& store = *rendezvous_->store();
  if (!store.check({latest_generation_key()})) return 0;
  const std::string text = get(latest_generation_key());
  try {
    size_t used = 0;
    const int64_t id = std::stoll(text, &used);
    if (used == text.size() && id >= 0) return id;
  } catch (const std::exception&) {
  }
  throw CommError(membership_context(env_.rank, "join"), "the store's newest generation record reads '" +
                                                             text.substr(0, 40) + "', not a generation number");
}

Generation Membership::generation(int64_t id) { return decode_generation(get(generation_key(id))); }

bool Membership::is_member(const Generation& g) const {
  auto it = g.incarnations.find(env_.rank);
  return it != g.incarnations.end() && it->second == incarnation_;
}

Generation Membership::await_member_generation(int64_t after) {
  const auto timeout = options_.comm.timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int64_t id = std::max(after + 1, first_candidate_);; ++id) {
    const auto left = std::chrono::duration_cast<comm::Millis>(deadline - std::chrono::steady_clock::now());
    if (left <= comm::Millis(0))
      throw CommError(membership_context(env_.rank, "join"),
                      "no generation admitted this process within " + std::to_string(timeout.count() / 1000) +
                          " s (are all ranks of its replica running? is the launcher's coordinator running: "
                          "crosstrain run with --max-restarts or elastic.enabled?)",
                      true);
    // In slices: a job that finished while this process (re)started publishes no generation for it.
    try {
      rendezvous_->store()->wait({generation_key(id)}, std::min(left, comm::Millis(500)));
    } catch (const CommError& e) {
      if (!e.timed_out()) throw;
      if (rendezvous_->store()->check({finished_key()})) throw JobFinished();
      --id;
      continue;
    }
    Generation g = decode_generation(get(generation_key(id)));
    // The first one that counts this process and that a failure has not closed: the members of the last
    // generation go there too (a join published after a failure waits until the failure's generation started).
    if (!is_member(g)) continue;
    auto& store = *rendezvous_->store();
    if (store.check({start_key(g.id)}) && get(start_key(g.id)) == kClosed) continue;
    return g;
  }
}

std::unique_ptr<comm::Communicator> Membership::build_world(const Generation& g) {
  const int index = g.index_of(env_.rank);
  if (index < 0) throw Error("rank " + std::to_string(env_.rank) + " is not a member of generation " + std::to_string(g.id));
  // A member that dies while the group forms must not hold the others for the whole job timeout.
  const comm::Millis timeout = group_timeout();
  const int64_t id = g.id;
  // A failure that ends the generation while its group forms sends the others elsewhere: stop waiting for them.
  // The predicates hold the flag, not this object: helper threads that outlive a given-up wait may still ask.
  const std::shared_ptr<std::atomic<int64_t>> failures = failure_generation_;
  const auto abandoned = [failures, id] { return failures->load() > id; };
  auto world = comm::make_gloo_communicator(rendezvous_, index, static_cast<int>(g.ranks.size()), timeout,
                                            "elastic/g" + std::to_string(g.id), abandoned);
  const EndedFn ended = [failures, id] { return failures->load() > id ? failures->load() : 0; };
  // The wrappers below set themselves up with collectives over the Gloo group (they exchange segment names and
  // pids, and a digest of their settings): abortable too, or a failure meanwhile holds the rest for the timeout.
  world = make_abortable(std::move(world), ended);
  world = comm::with_encryption(std::move(world), comm::data_plane_security(options_.comm, env_.secret,
                                                                           options_.cluster >= 0 ? options_.cluster
                                                                                                 : env_.cluster));
  // Its small all-reduces run inline, inside the call, where the abortable wrapper below cannot reach them.
  if (options_.comm.shared_memory)
    world = comm::with_shared_memory(std::move(world), 8 << 20, abandoned);
  world = comm::with_algorithms(std::move(world), options_.comm);
  return make_abortable(std::move(world), ended);
}

bool Membership::start(const Generation& g, int64_t step) {
  const std::string value = from_bytes(rendezvous_->store()->compareSet(start_key(g.id), {}, to_bytes(std::to_string(step))));
  if (value == kClosed) return false;
  if (value != std::to_string(step))
    throw Error("generation " + std::to_string(g.id) + " started at step " + value + " on another member but at step " +
                std::to_string(step) + " here: the members' states differ (a bug; please report it)");
  return true;
}

Decision Membership::vote(const Generation& g, int64_t step, bool stop) {
  return cast_vote(*rendezvous_->store(), g.id, static_cast<int64_t>(g.ranks.size()), step, stop, latest_->load());
}

void Membership::post_vote(const Generation& g, int64_t step, bool stop) {
  if (!voter_) {
    const LaunchEnv env = env_;
    const comm::Millis timeout = options_.comm.timeout();
    const auto connect = [env, timeout] {
      std::shared_ptr<comm::Rendezvous> client = connect_retrying(env, -1, timeout);
      return VoterConnection{client->store(), client};
    };
    // Its connection may take a timeout to open and its get another: beyond both, the thread is stuck.
    voter_ = std::make_unique<StepVoter>(connect, latest_, 2 * timeout + comm::Millis(5000), env_.rank);
  }
  voter_->post(g.id, static_cast<int64_t>(g.ranks.size()), step, stop);
}

Decision Membership::await_decision(const Generation& g, int64_t step) {
  // The last voter writes it at once; the coordinator writes an abort within the failure timeout of a death.
  return decode_decision(get(decision_key(g.id, step)));  // the store's get waits for the key
}

}  // namespace crosstrain::elastic
