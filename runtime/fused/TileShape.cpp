// How large the fused ops' similarity tiles are: from the L2 cache on the CPU,
// fixed on the GPU, DLOSS_TILE for both.
#include "runtime/fused/TileShape.h"

#include "runtime/support/Error.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dloss {

namespace {

int64_t l2CacheBytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes > 0)
    return bytes;
#endif
  // Some libcs (musl, containers without the auxv entries) report 0.
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index2/size");
  std::string text;
  if (file >> text) {
    char *end = nullptr;
    long long size = std::strtoll(text.c_str(), &end, 10);
    int64_t unit = *end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : 1;
    if (size > 0)
      return size * unit;
  }
  return 1 << 20;
}

TileShape parseTile(const std::string &text) {
  size_t x = text.find('x');
  auto positive = [](const std::string &part, int64_t &out) {
    if (part.empty() ||
        part.find_first_not_of("0123456789") != std::string::npos ||
        part.size() > 9)
      return false;
    out = std::stoll(part);
    return out > 0;
  };
  TileShape tile{0, 0};
  if (x == std::string::npos || !positive(text.substr(0, x), tile.rows) ||
      !positive(text.substr(x + 1), tile.cols))
    throw Error("environment variable DLOSS_TILE='" + text +
                    "' is malformed: expected ROWSxCOLS with positive sizes",
                "Set DLOSS_TILE=128x512 (rows x columns of a similarity "
                "tile), or unset it to size tiles from the L2 cache");
  return tile;
}

} // namespace

TileShape fusedTileShape(size_t elementSize) {
  if (const char *value = std::getenv("DLOSS_TILE"); value && *value)
    return parseTile(value);
  // One tile in about half the L2 cache leaves room for the operand blocks.
  int64_t budget = l2CacheBytes() / 2 / static_cast<int64_t>(elementSize);
  int64_t rows = std::clamp<int64_t>(budget / 512, 32, 256);
  int64_t cols = std::max<int64_t>(64, budget / rows / 64 * 64);
  return {rows, cols};
}

namespace fused {

TileShape clippedTile(int64_t rows, int64_t cols, at::ScalarType type) {
  TileShape tile = fusedTileShape(c10::elementSize(type));
  return {std::min(tile.rows, std::max<int64_t>(rows, 1)),
          std::min(tile.cols, std::max<int64_t>(cols, 1))};
}

// 2048 x 4096 by default: its fp32 S (32 MiB) stays in Hopper's 50 MB L2
/// between the GEMM and its epilogue; the GEMM has 256 output tiles of
/// 128 x 256 (two waves on 132 SMs), and the backward GEMMs get K = 2048 or
/// 4096, enough for cuBLAS's split-K/stream-K. Memory stays O(tile): 48 MiB
/// of workspace in bf16, against GiBs for the full similarity.
TileShape deviceTileShape(int64_t rows, int64_t cols) {
  TileShape tile{2048, 4096};
  if (const char *value = std::getenv("DLOSS_TILE"); value && *value)
    tile = parseTile(value);
  return {std::min(tile.rows, std::max<int64_t>(rows, 1)),
          std::min(tile.cols, std::max<int64_t>(cols, 1))};
}

} // namespace fused
} // namespace dloss
