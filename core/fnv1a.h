// FNV-1a, 64 bits (Fowler, Noll, Vo): the one fingerprint of bytes in the project, for a
// training corpus, the files of the model a server holds, and the golden ids and tensors of the
// tests. Cheap and stable, not a cryptographic hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tapegrad {

/// FNV-1a's offset basis: the hash of no bytes.
inline constexpr std::uint64_t kFnv1a64Start = 0xcbf29ce484222325ull;

/// The hash of n bytes at data, continuing from `hash`: fnv1a64(b, fnv1a64(a)) is the hash of a
/// followed by b, so a file read in pieces or a folder's files in turn hash as one stream.
inline std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t hash = kFnv1a64Start) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

/// fnv1a64 of a string's bytes.
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t hash = kFnv1a64Start) {
  return fnv1a64(bytes.data(), bytes.size(), hash);
}

}  // namespace tapegrad
