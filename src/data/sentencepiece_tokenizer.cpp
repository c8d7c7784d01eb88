#include "crosstrain/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "crosstrain/core/error.h"

namespace crosstrain::data {

namespace {

// The entry points of libcrosstrain_sentencepiece.so (src/data/sentencepiece/module.cpp says why it is apart).
struct Module {
  bool (*train)(const std::unordered_map<std::string, std::string>*, bool (*)(void*, std::string*), void*,
                std::string*, std::string*);
  void* (*load)(const std::string*, std::string*);
  void (*free)(void*);
  int (*size)(const void*);
  bool (*encode)(const void*, const char*, size_t, std::vector<int>*, std::string*);
  bool (*decode)(const void*, const std::vector<int>*, std::string*);
};

// Where the module may be: beside the running program (the build folder, or an installed bin/ next to lib/),
// then where this build put it and where it installs it.
std::vector<std::string> module_candidates() {
  const char* name = "libcrosstrain_sentencepiece.so";
  std::vector<std::string> paths;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back((exe.parent_path() / name).string());
    paths.push_back((exe.parent_path().parent_path() / "lib" / name).string());
  }
#ifdef CROSSTRAIN_SP_MODULE_BUILD
  paths.push_back(CROSSTRAIN_SP_MODULE_BUILD);
#endif
#ifdef CROSSTRAIN_SP_MODULE_INSTALL
  paths.push_back(CROSSTRAIN_SP_MODULE_INSTALL);
#endif
  return paths;
}

template <typename F>
void bind(void* handle, const char* symbol, F& f) {
  f = reinterpret_cast<F>(dlsym(handle, symbol));
  if (!f) throw Error(std::string("libcrosstrain_sentencepiece.so lacks ") + symbol + "; rebuild crosstrain");
}

Module open_module() {
  std::string tried;
  for (const auto& path : module_candidates()) {
    if (!std::filesystem::exists(path)) continue;
    // Local and deep-bound: its protobuf copy serves it alone (see module.cpp).
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!handle) {
      tried += std::string(" ") + dlerror();
      continue;
    }
    Module m{};
    bind(handle, "crosstrain_sp_train", m.train);
    bind(handle, "crosstrain_sp_load", m.load);
    bind(handle, "crosstrain_sp_free", m.free);
    bind(handle, "crosstrain_sp_size", m.size);
    bind(handle, "crosstrain_sp_encode", m.encode);
    bind(handle, "crosstrain_sp_decode", m.decode);
    return m;  // never closed: tokenizers may live until the process ends
  }
  throw Error("cannot load SentencePiece support (libcrosstrain_sentencepiece.so, built with crosstrain and "
              "installed beside it): not found or not loadable;" + (tried.empty() ? std::string(" not found") : tried) +
              ". Is libsentencepiece0 installed (scripts/install-deps.sh)?");
}

// Opened once per process, on first use; read-only afterwards.
const Module& module() {
  static const Module m = open_module();
  return m;
}

bool next_line_thunk(void* context, std::string* line) {
  return (*static_cast<const std::function<bool(std::string&)>*>(context))(*line);
}

std::unordered_map<std::string, std::string> trainer_arguments(const SentencePieceTraining& o) {
  return {
      {"model_type", o.type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes)},
      // A large corpus: train on a random sample of 10 million lines (sentencepiece holds them all in memory).
      {"input_sentence_size", "10000000"},
      {"shuffle_input_sentence", "true"},
      // Lossless: the text comes back exactly (see the header).
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      // sentencepiece logs every training step on stderr at its default level; errors come back as a status.
      {"minloglevel", "2"},
  };
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  void* processor = nullptr;
  std::string serialized;
  std::string type;
  ~Impl() {
    if (processor) module().free(processor);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer SentencePieceTokenizer::train(const SentencePieceTraining& options,
                                                     const std::function<bool(std::string&)>& next_line) {
  if (options.type != "bpe" && options.type != "unigram")
    throw UsageError("tokenizer type '" + options.type + "' is not one of bpe, unigram");
  // 256 byte pieces and <unk>, <s>, </s> come first; the vocabulary must leave room for learned pieces.
  if (options.vocab_size < 260)
    throw UsageError("vocabulary size " + std::to_string(options.vocab_size) +
                     " is too small: SentencePiece with byte fallback reserves 259 ids (256 bytes, <unk>, <s>, </s>); "
                     "use e.g. 1024 or more");
  const auto flags = trainer_arguments(options);
  std::string model, error;
  if (!module().train(&flags, next_line_thunk, const_cast<std::function<bool(std::string&)>*>(&next_line), &model,
                      &error)) {
    // sentencepiece prefixes its reason with the source line and the failed check: keep the reason.
    const size_t check = error.rfind("] ");
    throw UsageError("cannot train a SentencePiece " + options.type + " model of " +
                     std::to_string(options.vocab_size) + " pieces: " +
                     (check == std::string::npos ? error : error.substr(check + 2)) + " (choose another --vocab-size)");
  }
  auto tokenizer = from_serialized(model, "the model just trained");
  tokenizer.impl_->type = "sentencepiece-" + options.type;
  return tokenizer;
}

SentencePieceTokenizer SentencePieceTokenizer::from_serialized(const std::string& model, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  std::string error;
  impl->processor = module().load(&model, &error);
  if (!impl->processor) throw UsageError(origin + " is not a SentencePiece model: " + error);
  impl->serialized = model;
  impl->type = "sentencepiece";  // the model type lives in the protobuf, whose definitions Debian does not ship
  return SentencePieceTokenizer(std::move(impl));
}

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read SentencePiece model '" + path + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return from_serialized(bytes.str(), "'" + path + "'");
}

std::vector<uint32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  std::vector<int> ids;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    end = end == std::string::npos ? text.size() : end + 1;
    ids.clear();
    std::string error;
    if (!module().encode(impl_->processor, text.data() + begin, end - begin, &ids, &error))
      throw Error("SentencePiece could not encode a line: " + error);
    out.insert(out.end(), ids.begin(), ids.end());
    begin = end;
  }
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  const int64_t size = vocab_size();
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    std::string text;
    module().decode(impl_->processor, &run, &text);
    out += text;
    run.clear();
  };
  for (int64_t id : ids) {
    if (id >= 0 && id < size) {
      run.push_back(static_cast<int>(id));
      continue;
    }
    flush();
    out += "<" + std::to_string(id) + ">";
  }
  flush();
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return module().size(impl_->processor); }
std::string SentencePieceTokenizer::type() const { return impl_->type; }
const std::string& SentencePieceTokenizer::serialized() const { return impl_->serialized; }

}  // namespace crosstrain::data
