// GuardedBackend: a c10d backend that checks each op before the group's own
// backend runs it; the mechanism under dloss.guard (python/dloss/guard.py).
//
// torch dispatches every op of a ProcessGroup, from Python or C++, to the
// backend registered for the tensors' device: all_reduce and barrier, and the
// ops a Python ProcessGroup cannot override (FSDP2's all_gather_into_tensor
// and reduce_scatter_tensor, their coalesced forms, reduce, gather, scatter,
// all_to_all, send and recv). The guard registers one GuardedBackend on the
// user's own group in place of its backends (Gloo for CPU tensors, NCCL for
// CUDA ones), so every holder of the group is covered: a DDP module or an
// FSDP2 mesh built before the guard, dloss's own communicators, Lightning.
//
// The check costs one small collective per op, on a side Gloo backend over
// the group's ranks: each rank contributes a 62-bit hash of its op's
// description and origin (the fingerprint), and one all-reduce of MAX over
// (hash, -hash) tells every rank whether all hashes are equal. No store
// operation and no Python call happen on that path. Only when the ranks
// disagree, or a rank waits longer than a poll interval, do the hooks (in
// Python: they name the user's line) record the op in the group's store and
// read the other ranks' records to say who called what where.
// Point-to-point ops are checked per pair and without blocking at the post
// (a ring posts each rank's recv before its send, so a post that waited for
// its peer would wait in a cycle): each end records its op when posted and
// compares it with its peer's before the wait.
#ifndef DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H
#define DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace dloss::comm {

/// What checks a guarded group's ops. Each hook runs on the thread that
/// calls the op, only on a slow path, and refuses the op by throwing; after
/// a refusal every later op of the group calls `refused`.
struct GuardHooks {
  /// Collective number `seq`, `call`, has waited `poll` for the other ranks
  /// (`first`: for the first time): records it where a rank that gives up
  /// can read it, and throws when another rank has given up already.
  std::function<void(int64_t seq, const std::string &call, bool first)> waiting;
  /// Collective `seq`, after waiting, passed: drops its record.
  std::function<void(int64_t seq)> passed;
  /// Collective `seq` met no agreement within the deadline: throws, naming
  /// the ranks that never came.
  std::function<void(int64_t seq, const std::string &call)> timedOut;
  /// The ranks reached different collectives as number `seq`: throws,
  /// naming each rank's.
  std::function<void(int64_t seq, const std::string &call)> disagreed;
  /// An op after a refusal: throws the refusal again.
  std::function<void(const std::string &call)> refused;
  /// When a send (`send`) to or a recv from `peer` with `tag` is posted:
  /// records it, and returns a token for `verify`.
  std::function<int64_t(const std::string &call, int peer, bool send, int tag)>
      post;
  /// Before the first wait of posted op `token`: compares it with its
  /// peer's record.
  std::function<void(int64_t token)> verify;
};

/// One installed guard: fixed once made. A new guard replaces the whole
/// object; an op in flight keeps the one it started with.
struct GuardConfig {
  GuardHooks hooks;
  /// A Gloo backend over the group's ranks, with its own connections, for
  /// the fingerprints.
  c10::intrusive_ptr<c10d::Backend> side;
  /// How long a rank waits for every rank to reach an op.
  std::chrono::milliseconds deadline{30000};
  /// How long a rank waits before it records the op it waits in.
  std::chrono::milliseconds poll{1000};
  /// Whether the group was refused already (under the guard this one
  /// replaces): every op calls `refused`.
  bool broken = false;
};

/// The fingerprint of an op's description: 62 bits, so that its negation
/// fits an int64.
int64_t fingerprint(const std::string &call);

/// The origin a framework's Python hook names for the ops this thread
/// calls until it is reset ("module 'encoder.0' (Linear)", set around an
/// FSDP2 parameter group's unshard and gradient reduction); returns the
/// previous one.
std::string setOriginOfThread(std::string origin);

/// Registers on `group`, in place of its backends, one that checks each op
/// with `hooks` and then runs it on the group's backend for the tensors'
/// device (ops with no tensor, such as barrier, on the group's default
/// backend). It takes c10d's CUSTOM backend type, the one slot a group of
/// torch's backends leaves free: a group whose backend is a custom one
/// cannot be guarded (dloss::Error). Guarding a guarded group replaces its
/// guard; collective numbers start again at 0.
void guardGroup(c10d::ProcessGroup &group,
                std::shared_ptr<const GuardConfig> config);

/// Gives `group` its own backends back; false when it was not guarded. The
/// guarded backend stays in the group's table, idle, for a later guard.
bool unguardGroup(c10d::ProcessGroup &group);

/// Whether a guard checks `group`'s ops now.
bool isGuarded(c10d::ProcessGroup &group);

/// Whether `group` has a backend for `device`: ProcessGroup's own
/// hasBackendForDeviceType, which torch 2.11 lacks.
bool hasBackend(const c10d::ProcessGroup &group, c10::DeviceType device);

/// The backend that moves `group`'s tensors of `device` (looking through a
/// GuardedBackend); null when the group has none for that device type.
c10::intrusive_ptr<c10d::Backend> movingBackend(c10d::ProcessGroup &group,
                                                c10::DeviceType device);

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H
