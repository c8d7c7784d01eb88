#include "crosstrain/core/names.h"

#include "crosstrain/core/error.h"

namespace crosstrain {
namespace {

constexpr size_t kMaxNameLength = 64;

bool alnum(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'); }

// At most 64 characters, anything outside printable ASCII as \xNN: safe to put into an error message.
std::string printable(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxNameLength; ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if (ch >= 0x20 && ch < 0x7f) {
      out += static_cast<char>(ch);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  if (text.size() > kMaxNameLength) out += "...";
  return out;
}

}  // namespace

bool is_valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength || !alnum(name.front())) return false;
  for (char ch : name)
    if (!alnum(ch) && ch != '.' && ch != '_' && ch != '-') return false;
  return true;
}

void check_name(const std::string& what, std::string_view name) {
  if (is_valid_name(name)) return;
  throw UsageError(what + " '" + printable(name) + "' is not a valid name: use 1 to 64 letters, digits, '.', '_' or "
                   "'-', starting with a letter or a digit");
}

std::string shell_quote(std::string_view text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string file_name_error(std::string_view name) {
  if (name.empty()) return "an empty file name";
  if (name.size() > 255) return "a file name longer than 255 characters";
  if (name == "." || name == "..") return "'" + std::string(name) + "' is a directory, not a file";
  for (const char c : name)
    if (c == '/' || c == '\\' || c == '\0')
      return "'" + printable(name) + "' is a path, not a file name in the same directory (it could reach files "
             "outside it)";
  return "";
}

}  // namespace crosstrain
