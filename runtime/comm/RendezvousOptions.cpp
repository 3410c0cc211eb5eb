// RendezvousOptions::fromEnvironment: reads torchrun's variables (no c10d
// here); reserveLoopbackPort.
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/support/Error.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

  // torchrun writes str(bool); torch reads only "True" as true, which would
  // take a typo for "no": anything but True/False (or 1/0) is refused.
  if (auto agent = readVariable("TORCHELASTIC_USE_AGENT_STORE")) {
    if (*agent == "True" || *agent == "1")
      options.agentStore = true;
    else if (*agent != "False" && *agent != "0")
      throwMalformed("TORCHELASTIC_USE_AGENT_STORE", *agent, "True or False",
                     "Set it to True when the launcher hosts the store at "
                     "MASTER_PORT (torchrun's agent does), else unset it");
  }
  if (auto restarts = readVariable("TORCHELASTIC_RESTART_COUNT"))
    options.restartCount = static_cast<int>(parseInteger(
        "TORCHELASTIC_RESTART_COUNT", *restarts, 0,
        std::numeric_limits<int>::max(), "a count of restarts (0 or more)",
        "Leave it to the launcher, or unset it for the first attempt"));

  return options;
}

int reserveLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int reuse = 1;
  if (fd < 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse)) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)) !=
          0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length) != 0) {
    std::string reason = std::strerror(errno);
    if (fd >= 0)
      ::close(fd);
    throw Error("cannot reserve a port on 127.0.0.1 for the rendezvous (" +
                    reason + ")",
                "Set MASTER_PORT to a free port and start the ranks under a "
                "launcher, or free some sockets");
  }
  // Kept open on purpose: the reservation lasts as long as this process.
  return ntohs(address.sin_port);
}

} // namespace dloss
