// Removes a test's scratch directory without std::filesystem::remove_all.
#ifndef DLOSS_TEST_RUNTIME_REMOVETREE_H
#define DLOSS_TEST_RUNTIME_REMOVETREE_H

#include <filesystem>
#include <system_error>

namespace dloss::test {

/// Removes `path` and everything under it (symlinks are not followed),
/// ignoring errors. Not std::filesystem::remove_all: torch 2.11's libtorch.so
/// exports a copy of it built with a newer libstdc++, which every test
/// binary binds to and which calls recursive_directory_iterator::__erase, a
/// function GCC 12's libstdc++ (Debian 12) lacks: a call through null.
inline void removeTree(const std::filesystem::path &path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(
          std::filesystem::symlink_status(path, ignored)))
    for (const auto &entry : std::filesystem::directory_iterator(path, ignored))
      removeTree(entry.path());
  std::filesystem::remove(path, ignored);
}

} // namespace dloss::test

#endif // DLOSS_TEST_RUNTIME_REMOVETREE_H
