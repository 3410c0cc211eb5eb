// The on-disk plan cache: one file per (source, options), checked before use.
//
// An entry holds a header line, the whole request it answers (so a colliding
// key can never hand back another loss's plan), the plan's length and
// checksum, and the plan. Reading checks all of them and then verifies the
// plan as any plan file is verified; anything wrong is reported and the
// entry recompiled, never executed.
#include "runtime/plan/PlanCache.h"

#include "runtime/plan/CompilerIdentity.h"
#include "runtime/support/Error.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <string_view>

#include <sys/stat.h>
#include <unistd.h>

namespace dloss {

namespace {

const char kMagic[] = "dloss plan cache 1\n";

std::atomic<int64_t> hits{0}, misses{0}, corrupt{0}, stored{0};

/// FNV-1a over `bytes`, from `seed`: two seeds make the 128-bit key, one the
/// plan's checksum. Not cryptographic: entries also carry their request.
uint64_t fnv1a(const void *bytes, size_t size, uint64_t seed) {
  uint64_t hash = seed;
  const auto *p = static_cast<const unsigned char *>(bytes);
  for (size_t i = 0; i < size; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// Everything the key stands for, in one string: `key=value` fields, each
/// ended by a NUL, then the source.
std::string requestText(const PlanRequest &request) {
  std::string text;
  auto field = [&text](std::string_view key, std::string_view value) {
    text.append(key).append("=").append(value).push_back('\0');
  };
  field("plan-version", std::to_string(kPlanVersion));
  field("compiler", kCompilerIdentity);
  field("name", request.name);
  field("grad-mode", request.gradMode);
  field("fuse", request.fuse ? "1" : "0");
  field("general-only", request.generalOnly ? "1" : "0");
  return text + request.source;
}

std::string hex(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx",
                static_cast<unsigned long long>(value));
  return buffer;
}

void putU64(std::string &out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

/// Reads a little-endian u64 at `offset`, advancing it; false past the end.
bool getU64(const std::string &in, size_t &offset, uint64_t &value) {
  if (in.size() < offset + 8)
    return false;
  value = 0;
  for (int i = 0; i < 8; ++i)
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[offset + i]))
             << (8 * i);
  offset += 8;
  return true;
}

std::string entryPath(const std::string &directory, const std::string &key) {
  return directory + "/" + key + ".plan";
}

/// mkdir -p; false (errno set) when a component cannot be made.
bool makeDirectories(const std::string &path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      return false;
    if (slash == std::string::npos)
      return true;
  }
}

/// Reports a rejected entry and removes it, so the next store replaces it.
void reject(const std::string &path, const std::string &why) {
  ++corrupt;
  std::cerr << "dloss: the cached plan '" << path << "' " << why
            << "; it was removed and the loss is compiled again\n";
  std::remove(path.c_str());
}

} // namespace

std::optional<std::string> planCacheDirectory() {
  if (const char *dir = std::getenv("DLOSS_CACHE_DIR"); dir && *dir) {
    if (std::string(dir) == "off")
      return std::nullopt;
    return std::string(dir);
  }
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/dloss";
  if (const char *home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/dloss";
  return std::nullopt;
}

std::string planCacheKey(const PlanRequest &request) {
  std::string text = requestText(request);
  return hex(fnv1a(text.data(), text.size(), 0xcbf29ce484222325ull)) +
         hex(fnv1a(text.data(), text.size(), 0x84222325cbf29ce4ull));
}

PlanCacheStats planCacheStats() {
  return PlanCacheStats{hits.load(), misses.load(), corrupt.load(),
                        stored.load()};
}

std::shared_ptr<const PlanFile> loadCachedPlan(const std::string &directory,
                                               const PlanRequest &request) {
  const std::string path = entryPath(directory, planCacheKey(request));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ++misses;
    return nullptr;
  }
  std::string entry((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  const std::string expected = requestText(request);
  const size_t magic = sizeof(kMagic) - 1;
  size_t offset = magic;
  uint64_t requestSize = 0, planSize = 0, checksum = 0;
  if (entry.compare(0, magic, kMagic) != 0) {
    reject(path, "is not a dloss plan cache entry (bad header)");
  } else if (!getU64(entry, offset, requestSize) ||
             entry.size() < offset + requestSize) {
    reject(path, "is truncated");
  } else if (entry.compare(offset, requestSize, expected) != 0) {
    reject(path,
           "was stored for another loss or other options (a key collision "
           "or a corrupt entry)");
  } else if (offset += requestSize, !getU64(entry, offset, planSize) ||
                                        !getU64(entry, offset, checksum) ||
                                        entry.size() != offset + planSize) {
    reject(path, "is truncated or has trailing bytes");
  } else if (fnv1a(entry.data() + offset, planSize, 0xcbf29ce484222325ull) !=
             checksum) {
    reject(path, "is corrupt (its checksum does not match)");
  } else {
    try {
      auto plan = PlanFile::fromBytes(
          std::vector<uint8_t>(entry.begin() + offset, entry.end()), path);
      ++hits;
      return plan;
    } catch (const Error &e) {
      reject(path,
             std::string("does not verify as a plan (") + e.problem() + ")");
    }
  }
  ++misses;
  return nullptr;
}

void storeCachedPlan(const std::string &directory, const PlanRequest &request,
                     const PlanFile &plan) {
  static std::once_flag warned;
  const std::string path = entryPath(directory, planCacheKey(request));
  const std::string partial =
      path + "." + std::to_string(getpid()) + ".partial";
  std::string entry = kMagic;
  const std::string text = requestText(request);
  putU64(entry, text.size());
  entry += text;
  const std::vector<uint8_t> &bytes = plan.bytes();
  putU64(entry, bytes.size());
  putU64(entry, fnv1a(bytes.data(), bytes.size(), 0xcbf29ce484222325ull));
  entry.append(bytes.begin(), bytes.end());

  bool ok = makeDirectories(directory);
  if (ok) {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(entry.data(), static_cast<std::streamsize>(entry.size()));
    out.close();
    ok = out.good() && std::rename(partial.c_str(), path.c_str()) == 0;
  }
  if (!ok) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    std::call_once(warned, [&] {
      std::cerr << "dloss: cannot write the plan cache in '" << directory
                << "' (" << why
                << "); plans are compiled in every process. Set "
                   "DLOSS_CACHE_DIR to a writable directory, or to 'off'\n";
    });
    return;
  }
  ++stored;
}

} // namespace dloss
