// How a rank reaches the others (torchrun's variables), and a port reserved
// for a job's rendezvous store.
#ifndef DLOSS_RUNTIME_COMM_RENDEZVOUSOPTIONS_H
#define DLOSS_RUNTIME_COMM_RENDEZVOUSOPTIONS_H

#include <chrono>
#include <string>

namespace dloss {

/// How to reach the other ranks, as torchrun describes it.
struct RendezvousOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  int rank = 0;
  int worldSize = 1;
  /// Deadline of every collective and of the rendezvous itself.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// Where a failed collective writes this rank's flight record
  /// (dloss-flight-rank<r>.json: its last 64 collectives); empty: the
  /// current directory. "off" writes none.
  std::string flightDir;
  /// Whether a launcher, not rank 0, hosts the store at masterPort (as
  /// torchrun's agent does with its default static rendezvous: it sets
  /// TORCHELASTIC_USE_AGENT_STORE=True). Then every rank is a client, and
  /// dloss keeps its keys under "dloss/attempt_<restartCount>/" so that a
  /// restarted job never reads an earlier attempt's.
  bool agentStore = false;
  /// TORCHELASTIC_RESTART_COUNT: which attempt this is (agentStore only).
  int restartCount = 0;

  /// From MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and DLOSS_TIMEOUT_S,
  /// DLOSS_FLIGHT_DIR, TORCHELASTIC_USE_AGENT_STORE,
  /// TORCHELASTIC_RESTART_COUNT);
  /// a missing or malformed variable is a dloss::Error saying which.
  static RendezvousOptions fromEnvironment();
};

/// A TCP port on 127.0.0.1 for a job's rendezvous store, reserved for the
/// rest of this process's life: it stays bound (SO_REUSEADDR, close on
/// exec, never listening), so the kernel gives it to no other bind(port 0),
/// while the job's rank 0 may still bind and listen on it (the c10d store
/// sets SO_REUSEADDR too). Picking a free port and closing it, as launchers
/// often do, lets two jobs started at once draw the same one. Throws
/// dloss::Error when no port can be bound.
int reserveLoopbackPort();

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_RENDEZVOUSOPTIONS_H
