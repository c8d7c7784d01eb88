// Helpers shared by the ledger's files (keys, chain, spot checks); not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace crosstrain::scheduler::ledger_detail {

// sodium_init once per process (idempotent and thread-safe in libsodium); throws if it fails.
void ensure_sodium();
std::string to_hex(const unsigned char* data, size_t size);
// Decodes exactly `size` bytes of lower- or upper-case hex; false on anything else.
bool from_hex(const std::string& hex, unsigned char* out, size_t size);
// Writes all of `text` to `fd` (retrying short writes); false on an error, with errno set.
bool write_all(int fd, const std::string& text);
// Writes `text` to PATH.tmp, fsyncs, renames it over `path`; throws a UsageError naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& text);
std::string read_whole_file(const std::string& path);
// A cluster name usable as a file name and in messages: 1-64 of [A-Za-z0-9._-], not starting with '.'.
bool valid_cluster_name(const std::string& name);

}  // namespace crosstrain::scheduler::ledger_detail
