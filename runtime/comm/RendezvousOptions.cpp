// RendezvousOptions::fromEnvironment: reads torchrun's variables (no c10d
// here).
#include "runtime/comm/Communicator.h"
#include "runtime/support/Error.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

namespace dloss {

namespace {

// nullopt for an unset variable; an empty value counts as set so that
// `RANK= ./prog` is reported rather than silently ignored.
std::optional<std::string> readVariable(const char *name) {
  const char *value = std::getenv(name);
  if (!value)
    return std::nullopt;
  return std::string(value);
}

[[noreturn]] void throwMalformed(const char *name, const std::string &value,
                                 const std::string &expected,
                                 const std::string &hint) {
  throw Error("environment variable " + std::string(name) + "='" + value +
                  "' is malformed: expected " + expected,
              hint);
}

// Whole-string decimal integer in [min, max]; strtoll alone would accept
// "12abc" or " 12", which hides typos in launch scripts.
int64_t parseInteger(const char *name, const std::string &value, int64_t min,
                     int64_t max, const std::string &expected,
                     const std::string &hint) {
  if (value.empty() || value.front() == ' ' || value.front() == '\t' ||
      value.front() == '+')
    throwMalformed(name, value, expected, hint);
  errno = 0;
  char *end = nullptr;
  long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end != value.c_str() + value.size() || parsed < min ||
      parsed > max)
    throwMalformed(name, value, expected, hint);
  return parsed;
}

std::chrono::milliseconds parseTimeout(const std::string &value) {
  const char *name = "DLOSS_TIMEOUT_S";
  const std::string expected =
      "a positive number of seconds such as 300 or 2.5";
  const std::string hint = "Set DLOSS_TIMEOUT_S to the deadline of the "
                           "rendezvous and of every collective, in seconds, "
                           "or unset it for the default of 300";
  if (value.empty() || value.front() == ' ' || value.front() == '\t')
    throwMalformed(name, value, expected, hint);
  errno = 0;
  char *end = nullptr;
  double seconds = std::strtod(value.c_str(), &end);
  // The upper bound keeps the conversion to milliseconds from overflowing;
  // a year is far beyond any sensible deadline.
  if (errno != 0 || end != value.c_str() + value.size() ||
      !std::isfinite(seconds) || seconds <= 0 || seconds > 365.0 * 24 * 3600)
    throwMalformed(name, value, expected, hint);
  auto milliseconds = static_cast<int64_t>(std::ceil(seconds * 1000.0));
  return std::chrono::milliseconds(milliseconds);
}

} // namespace

RendezvousOptions RendezvousOptions::fromEnvironment() {
  RendezvousOptions options;

  if (auto addr = readVariable("MASTER_ADDR")) {
    if (addr->empty())
      throw Error("environment variable MASTER_ADDR is set but empty",
                  "Set MASTER_ADDR to the host name or address of rank 0, or "
                  "unset it for 127.0.0.1");
    options.masterAddr = *addr;
  }

  if (auto port = readVariable("MASTER_PORT"))
    options.masterPort = static_cast<int>(parseInteger(
        "MASTER_PORT", *port, 1, 65535, "a TCP port between 1 and 65535",
        "Set MASTER_PORT to a free port on rank 0's host, or unset it for "
        "29500"));

  std::optional<std::string> rankValue = readVariable("RANK");
  std::optional<std::string> worldValue = readVariable("WORLD_SIZE");
  const std::string launchHint =
      "Launch with torchrun, or set both RANK and WORLD_SIZE (RANK from 0 to "
      "WORLD_SIZE-1), or unset both for a single process";
  // Neither set: a plain single-process run, as torch.distributed would not
  // guess a larger job either.
  if (worldValue) {
    options.worldSize = static_cast<int>(parseInteger(
        "WORLD_SIZE", *worldValue, 1, std::numeric_limits<int>::max(),
        "a positive number of ranks", launchHint));
  } else if (rankValue) {
    throw Error("environment variable RANK='" + *rankValue +
                    "' is set but WORLD_SIZE is not",
                launchHint);
  }
  if (rankValue) {
    options.rank = static_cast<int>(
        parseInteger("RANK", *rankValue, 0, std::numeric_limits<int>::max(),
                     "a rank between 0 and WORLD_SIZE-1", launchHint));
    if (options.rank >= options.worldSize)
      throw Error("environment variable RANK='" + *rankValue +
                      "' is out of range for WORLD_SIZE=" +
                      std::to_string(options.worldSize),
                  launchHint);
  } else if (options.worldSize > 1) {
    // Guessing rank 0 would start two store servers or none; refuse instead.
    throw Error("environment variable WORLD_SIZE=" + *worldValue +
                    " is set but RANK is not",
                launchHint);
  }

  if (auto timeout = readVariable("DLOSS_TIMEOUT_S"))
    options.timeout = parseTimeout(*timeout);

  if (auto flightDir = readVariable("DLOSS_FLIGHT_DIR"))
    options.flightDir = *flightDir;

  return options;
}

} // namespace dloss
