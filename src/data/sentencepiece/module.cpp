// The SentencePiece module: libsentencepiece behind a few C entry points, in its own shared object that the data
// layer opens with dlopen (sentencepiece_tokenizer.cpp).
//
// Why a module: Debian's libsentencepiece carries its own copy of protobuf-lite 3.14 and exports its symbols,
// while libtorch loads the system's libprotobuf 3.21. Linked into one program, whichever library comes first
// in the symbol search order serves both, and the other crashes (at start-up, before main). Opened with
// RTLD_LOCAL | RTLD_DEEPBIND, this object and libsentencepiece resolve protobuf to libsentencepiece's copy and
// hide it from everyone else. Both sides share libstdc++, so std::string and std::vector pass between them.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace {

class CallbackLines : public sentencepiece::SentenceIterator {
 public:
  CallbackLines(bool (*next)(void*, std::string*), void* context) : next_(next), context_(context) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(context_, &line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  bool (*next_)(void*, std::string*);
  void* context_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

extern "C" {

// Trains with sentencepiece's flags; returns false with the reason in `error`.
bool crosstrain_sp_train(const std::unordered_map<std::string, std::string>* flags,
                         bool (*next_line)(void*, std::string*), void* context, std::string* model,
                         std::string* error) {
  CallbackLines lines(next_line, context);
  const auto status = sentencepiece::SentencePieceTrainer::Train(*flags, &lines, model);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

// A processor for a serialized model, or null with the reason in `error`.
void* crosstrain_sp_load(const std::string* model, std::string* error) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->LoadFromSerializedProto(*model);
  if (status.ok()) return processor;
  *error = status.ToString();
  delete processor;
  return nullptr;
}

void crosstrain_sp_free(void* processor) { delete static_cast<sentencepiece::SentencePieceProcessor*>(processor); }

int crosstrain_sp_size(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

bool crosstrain_sp_encode(const void* processor, const char* text, size_t size, std::vector<int>* ids,
                          std::string* error) {
  const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Encode(
      std::string_view(text, size), ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool crosstrain_sp_decode(const void* processor, const std::vector<int>* ids, std::string* text) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Decode(*ids, text).ok();
}

}  // extern "C"
