// Files that others send (issue 34), mutated thousands of times: checkpoint manifests and their safetensors pieces,
// Hugging Face directories (weight_map paths, shard headers and dtypes), tokenizer.json, trace files. A reader may
// accept a mutated file or refuse it with crosstrain's own error naming it; it must not crash, throw another kind
// of exception (a JSON library's, std::out_of_range) or allocate what the file does not hold (the address space
// is capped a few GiB above the test's own, so such an allocation shows up as std::bad_alloc). Hostile cases on
// top: piece files and shards named by paths that leave the directory, pieces that overlap, shapes of 2^62.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/obs/trace_analysis.h"
#include "crosstrain/obs/trace_file.h"
#include "in_process_run.h"
#include "scratch.h"
#include "train_fixture.h"

namespace crosstrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
void spill(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// Caps the address space at the current size plus 6 GiB, once: no reader of these KB-sized files needs more.
void cap_memory() {
  static const bool capped = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmSize:", 0) == 0) {
        const rlim_t now_kb = std::stoull(line.substr(7));
        const rlim_t limit = (now_kb << 10) + (rlim_t{6} << 30);
        rlimit r{limit, limit};
        setrlimit(RLIMIT_AS, &r);
      }
    return true;
  }();
  (void)capped;
}

// "ok", "refused" (crosstrain's error), or what went wrong.
template <typename F>
std::string outcome(F&& read) {
  try {
    read();
    return "ok";
  } catch (const Error&) {
    return "refused";
  } catch (const std::bad_alloc&) {
    return "BAD_ALLOC: an allocation the file does not justify";
  } catch (const std::exception& e) {
    return std::string("FOREIGN EXCEPTION: ") + e.what();
  }
}

// One random change to a file: a flipped byte, a cut, a doubled piece, a number made huge or negative.
std::string mutate(const std::string& s, std::mt19937& rng) {
  if (s.empty()) return s;
  std::string m = s;
  const size_t at = rng() % m.size();
  switch (rng() % 7) {
    case 0: m[at] = static_cast<char>(m[at] ^ (1 << (rng() % 8))); break;
    case 1: m.resize(at); break;
    case 2: m.insert(at, m.substr(at, rng() % 64)); break;
    case 3: m.erase(at, 1 + rng() % 16); break;
    case 4:
    case 5: {  // the next number: huge, negative, or not one
      const size_t d = m.find_first_of("0123456789", at);
      if (d == std::string::npos) break;
      const size_t end = m.find_first_not_of("0123456789", d);
      static const char* kNumbers[] = {"4611686018427387904", "-1", "99999999999999999999999", "0", "1e300", "2147483648"};
      m.replace(d, (end == std::string::npos ? m.size() : end) - d, kNumbers[rng() % 6]);
      break;
    }
    default: m[at] = static_cast<char>(rng()); break;
  }
  return m;
}

// Runs `read` on `rounds` mutations of `file` (restored afterwards); expects only "ok" and "refused".
void fuzz(const fs::path& file, int rounds, uint32_t seed, const std::function<void()>& read) {
  cap_memory();
  const std::string original = slurp(file);
  std::mt19937 rng(seed);
  int refused = 0;
  for (int i = 0; i < rounds; ++i) {
    std::string m = mutate(original, rng);
    if (rng() % 3 == 0) m = mutate(m, rng);
    spill(file, m);
    const std::string o = outcome(read);
    refused += o == "refused";
    if (o != "ok" && o != "refused") {
      ADD_FAILURE() << file.filename() << " mutation " << i << ": " << o << "\nthe file began: "
                    << m.substr(0, 400);
      spill(file, original);
      return;
    }
  }
  spill(file, original);
  EXPECT_GT(refused, rounds / 20) << "the mutations barely changed anything: the fuzzer is not reaching the reader";
  EXPECT_EQ(outcome(read), "ok") << "the original no longer reads";
}

// A tiny GPT trained for 2 steps: its newest checkpoint and its Hugging Face export in shards (so the export has
// an index with a weight_map).
struct Trained {
  train::Config config;
  std::string checkpoint;
  std::vector<std::string> params;
};
const Trained& trained() {
  static const Trained t = [] {
    Trained t;
    t.config = testing::tiny_config("reader_fuzz");
    t.config.train.steps = 2;
    t.config.train.warmup_steps = 0;
    const auto runs = testing::train_in_process(t.config, 1);
    for (const auto& [name, tensor] : runs[0].dump.shards) t.params.push_back(name);
    t.checkpoint = *checkpoint::latest_checkpoint(t.config.run.dir);
    return t;
  }();
  return t;
}

fs::path fresh_copy(const std::string& from, const std::string& tag) {
  const fs::path dir = testing::scratch_dir("reader-fuzz-" + tag);
  fs::remove_all(dir);
  fs::copy(from, dir, fs::copy_options::recursive);
  return dir;
}

void read_checkpoint(const fs::path& dir) {
  checkpoint::CheckpointReader reader(dir.string());
  reader.verify(true);
  for (const auto& t : reader.tensors())
    reader.read_full(t, [](const std::string&, const at::Tensor& full, int, int) { return full; });
}

std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ReaderFuzz, CheckpointManifestsAndPiecesMutatedAreReadOrRefused) {
  const fs::path dir = fresh_copy(trained().checkpoint, "ckpt");
  fuzz(dir / "manifest.json", 1500, 1, [&] { read_checkpoint(dir); });
  fuzz(dir / "rank-00000.safetensors", 700, 2, [&] { read_checkpoint(dir); });
}

TEST(ReaderFuzz, AManifestCannotReachFilesOutsideTheCheckpointOrOverlapItsPieces) {
  const fs::path dir = fresh_copy(trained().checkpoint, "ckpt-hostile");
  const std::string original = slurp(dir / "manifest.json");
  auto with = [&](const std::function<void(json&)>& change) {
    json m = json::parse(original);
    change(m);
    spill(dir / "manifest.json", m.dump());
    return refusal([&] { read_checkpoint(dir); });
  };
  for (const char* path : {"../../../etc/passwd", "/etc/passwd", "sub/../../x.safetensors"}) {
    const std::string why = with([&](json& m) { m["pieces"][0]["file"] = path; });
    EXPECT_NE(why.find("is a path, not a file name"), std::string::npos) << path << ": " << why;
  }
  EXPECT_NE(with([](json& m) { m["pieces"][0]["file"] = ".."; }).find("is a directory"), std::string::npos);
  // The second piece of a shard starting inside the first (the other elements left out).
  std::string why = with([](json& m) {
    json& p = m["pieces"][0];
    json copy = p;
    p["numel"] = p["numel"].get<int64_t>() / 2;
    copy["offset"] = copy["numel"].get<int64_t>() / 4;
    copy["numel"] = copy["numel"].get<int64_t>() - copy["offset"].get<int64_t>();
    m["pieces"].push_back(copy);
  });
  EXPECT_NE(why.find("overlap"), std::string::npos) << why;
  why = with([](json& m) {
    m["pieces"][0]["global_shape"] = json::array({int64_t{1} << 31, int64_t{1} << 31});
    m["pieces"][0]["shard_shape"] = m["pieces"][0]["global_shape"];
  });
  EXPECT_NE(why.find("more than 2^40 elements"), std::string::npos) << why;
  why = with([](json& m) { m["pieces"][0]["tp_size"] = 0; });
  EXPECT_NE(why.find("tp_size"), std::string::npos) << why;
  spill(dir / "manifest.json", original);
  EXPECT_EQ(refusal([&] { read_checkpoint(dir); }), "(accepted)");
}

TEST(ReaderFuzz, HuggingFaceDirectoriesMutatedAreReadOrRefused) {
  const fs::path root = testing::scratch_dir("reader-fuzz-hf");
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string dir = (root / "export").string();
  auto source = train::open_weights(trained().config.run.dir);
  const auto result = train::write_hf_directory(dir, *source, 20000);  // several shards: an index
  ASSERT_GT(result.files.size(), 1u);
  auto read = [&] {
    auto w = train::open_weights(dir);
    w->check();
    for (const auto& name : trained().params) w->read(name);
  };
  fuzz(fs::path(dir) / "model.safetensors.index.json", 800, 3, read);
  fuzz(fs::path(dir) / result.files.front(), 500, 4, read);
  fuzz(fs::path(dir) / "config.json", 500, 5, read);
  // A weight_map entry naming a file outside the directory.
  const std::string index = slurp(fs::path(dir) / "model.safetensors.index.json");
  json j = json::parse(index);
  j["weight_map"].begin().value() = "../../outside.safetensors";
  spill(fs::path(dir) / "model.safetensors.index.json", j.dump());
  const std::string why = refusal(read);
  EXPECT_NE(why.find("is a path, not a file name"), std::string::npos) << why;
  j["weight_map"].begin().value() = 7;
  spill(fs::path(dir) / "model.safetensors.index.json", j.dump());
  EXPECT_NE(refusal(read).find("is not a file name"), std::string::npos);
  spill(fs::path(dir) / "model.safetensors.index.json", index);
}

TEST(ReaderFuzz, TokenizerJsonMutatedIsReadOrRefused) {
  const fs::path dir = testing::scratch_dir("reader-fuzz-tokenizer");
  const fs::path path = dir / "tokenizer.json";
  spill(path, R"({"version": "1.0", "added_tokens": [{"id": 16, "content": "<|endoftext|>", "special": true}],)"
              R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "d": 4, "ab": 5, "bc": 6,)"
              R"("abc": 7, "Ġa": 8, "Ġab": 9, "Ċ": 10, "Ã": 11, "©": 12, "Ã©": 13, "'": 14, "s": 15},)"
              R"("merges": ["b c", "a b", "a bc", "Ġ a", "Ġ ab", "Ã ©"]}})");
  fuzz(path, 2000, 6, [&] {
    auto t = data::load_tokenizer(path.string());
    const auto ids = t->encode(" abc d's\n");
    std::vector<int64_t> wide(ids.begin(), ids.end());
    wide.push_back(t->vocab_size() - 1);
    t->decode(wide);
  });
}

TEST(ReaderFuzz, TraceFilesMutatedAreReadOrRefused) {
  const auto files = obs::find_trace_files(trained().config.run.dir);
  ASSERT_FALSE(files.empty());
  const fs::path dir = testing::scratch_dir("reader-fuzz-trace");
  const fs::path path = dir / "rank-0.json";
  fs::copy_file(files.front().path, path, fs::copy_options::overwrite_existing);
  fuzz(path, 1500, 7, [&] {
    const json events = obs::read_trace_file(path.string());
    obs::analyze_trace(obs::align_and_sort({events}));
  });
}

}  // namespace
}  // namespace crosstrain
