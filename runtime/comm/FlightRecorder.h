// The flight recorder: a rank's last collectives, written as JSON when one
// fails.
#ifndef DLOSS_RUNTIME_FLIGHTRECORDER_H
#define DLOSS_RUNTIME_FLIGHTRECORDER_H

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dloss {

/// One collective as the recorder keeps it.
struct FlightEntry {
  enum class State { Started, Completed, Failed };

  int64_t seq = 0;        ///< The communicator's collective number.
  std::string collective; ///< "allGather", "allGatherInts", ...
  std::string function;   ///< The call site (CallSite), when known.
  std::string op;
  std::string location;
  std::string phase;
  std::string shape; ///< "[4, 16]"; the values' count for ints.
  std::string dtype; ///< "Float", "Long".
  int64_t bytes = 0; ///< What this rank contributes.
  State state = State::Started;
  int64_t startUnixMs = 0; ///< Wall clock, comparable across ranks.
  double durationMs = -1;  ///< Set when the collective ends.
  std::string error;       ///< Why it failed.
};

/// The last kCapacity collectives of one communicator, oldest first. Not
/// thread-safe (communicators are not either).
class FlightRecorder {
public:
  static constexpr size_t kCapacity = 64;

  /// Records `entry` as started now; returns a handle for finish().
  uint64_t start(FlightEntry entry);
  /// Marks the entry completed or failed (no-op when it was overwritten).
  void finish(uint64_t handle, FlightEntry::State state,
              const std::string &error = {});
  /// The entries, oldest first.
  std::vector<FlightEntry> entries() const;

  /// What a dump says besides the entries.
  struct Header {
    int rank = 0;
    int worldSize = 1;
    double timeoutSeconds = 0;
    std::string reason;             ///< The error being raised.
    std::vector<std::string> peers; ///< Each peer's state, as read.
  };
  /// Writes `dir`/dloss-flight-rank<r>.json and returns its path; raises
  /// std::runtime_error (saying why) when it cannot.
  std::string write(const std::string &dir, const Header &header) const;
  /// The JSON text write() stores.
  std::string toJson(const Header &header) const;

  static const char *stateName(FlightEntry::State state);

private:
  struct Slot {
    FlightEntry entry;
    uint64_t handle = 0;
    std::chrono::steady_clock::time_point started;
  };
  std::vector<Slot> slots;
  uint64_t next = 1; // handles start at 1; slot = (handle - 1) % kCapacity
};

} // namespace dloss

#endif // DLOSS_RUNTIME_FLIGHTRECORDER_H
