#include "crosstrain/comm/diagnostics/hang_doctor.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "crosstrain/comm/rendezvous.h"

namespace crosstrain::comm {
namespace {

const std::string kRequests = "obs/diag/requests";
std::string request_key(int64_t n) { return "obs/diag/req/" + std::to_string(n); }
std::string answer_key(int64_t n, int rank) { return "obs/diag/ans/" + std::to_string(n) + "/" + std::to_string(rank); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::shared_ptr<Rendezvous> connect_tool(const LaunchEnv& env, Millis timeout) {
  return Rendezvous::connect(env.master_addr, env.master_port, -1, env.world_size, timeout,
                             JobCredentials{env.job_id, env.secret});
}

}  // namespace

HangDoctor::HangDoctor(const LaunchEnv& env, Millis answer_within, Millis timeout)
    : env_(env), timeout_(timeout), rank_(env.rank), world_size_(env.world_size), answer_within_(answer_within),
      asking_(connect_tool(env, timeout)), answering_(connect_tool(env, timeout)) {
  answerer_ = std::thread([this] { answer_loop(); });
}

HangDoctor::~HangDoctor() {
  stop_ = true;
  if (answerer_.joinable()) answerer_.join();
}

void HangDoctor::watch(std::shared_ptr<FlightRecorder> recorder) {
  std::lock_guard<std::mutex> lock(mu_);
  recorder_ = std::move(recorder);
}

RankStatus HangDoctor::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (recorder_) return recorder_->status();
  RankStatus s;
  s.rank = rank_;
  s.activity = "starting (no run yet)";
  return s;
}

// Questions are numbered; each rank answers them in order, waiting for the next in short slices so that it
// notices when it should stop. A wait that fails at once (not by its 200 ms timeout) means the connection broke
// (the store's host ended): the loop then sleeps and reconnects, rather than spin on a dead socket.
void HangDoctor::answer_loop() {
  auto store = answering_->store();
  int64_t next = 1;
  while (!stop_) {
    const auto asked = std::chrono::steady_clock::now();
    try {
      store->wait({request_key(next)}, std::chrono::milliseconds(200));
    } catch (const std::exception&) {
      if (std::chrono::steady_clock::now() - asked < std::chrono::milliseconds(150)) store = reconnect();
      continue;
    }
    try {
      store->set(answer_key(next, rank_), bytes(to_json(status())));
    } catch (const std::exception&) {
    }
    ++next;
  }
}

c10::intrusive_ptr<c10d::Store> HangDoctor::reconnect() {
  for (int i = 0; i < 5 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  try {
    answering_ = connect_tool(env_, std::min(timeout_, Millis(1000)));
  } catch (const std::exception&) {
  }
  return answering_->store();
}

std::string HangDoctor::diagnose(const OpRecord& stuck, const std::string& group, const std::vector<int>& members) {
  const auto start = std::chrono::steady_clock::now();
  try {
    auto store = asking_->store();
    const int64_t n = store->add(kRequests, 1);
    store->set(request_key(n), bytes(group + " #" + std::to_string(stuck.seq) + " from rank " + std::to_string(rank_)));
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r) keys.push_back(answer_key(n, r));
    try {
      store->wait(keys, answer_within_);
    } catch (const std::exception&) {
      // Some did not answer in time: diagnose with the answers there are.
    }
    std::vector<RankStatus> answers;
    for (int r = 0; r < world_size_; ++r) {
      if (!store->check({keys[r]})) continue;
      const std::vector<uint8_t> value = store->get(keys[r]);
      answers.push_back(rank_status_from_json(std::string(value.begin(), value.end())));
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return diagnose_hang(stuck, group, members, rank_, answers, waited);
  } catch (const std::exception& e) {
    return std::string("hang diagnosis failed: ") + e.what();
  }
}

}  // namespace crosstrain::comm
