// Names that others give crosstrain (clusters, jobs, users) end up in paths, generated scripts, SQL rows and log
// lines: one grammar for all of them, checked where they come in. And one way to put any text into a shell
// script as a single word.
#pragma once

#include <string>
#include <string_view>

namespace crosstrain {

// 1 to 64 characters of [A-Za-z0-9._-], the first a letter or a digit.
bool is_valid_name(std::string_view name);
// Throws UsageError naming `what` and the rule, with the offending text cut and made printable.
void check_name(const std::string& what, std::string_view name);
// Files that others' manifests and indexes name (a checkpoint's pieces, a Hugging Face shard) must lie in the
// directory that holds the manifest: "" for a plain file name, else why not (a path, "..", empty, a NUL byte).
std::string file_name_error(std::string_view name);
// The text as one single-quoted shell word: spaces, $, quotes and ; stay literal.
std::string shell_quote(std::string_view text);

}  // namespace crosstrain
