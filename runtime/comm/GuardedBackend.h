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
// The backend describes each op ("all_gather_into_tensor float32[4x8]") and
// hands it to the checker, which records it on the store and compares it with
// every rank's before the op runs; a refusal is the checker's exception.
// Point-to-point ops are checked per pair and without blocking at the post
// (a ring posts each rank's recv before its send, so a post that waited for
// its peer would wait in a cycle): each end records its op when posted and
// compares it with its peer's before the wait.
#ifndef DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H
#define DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace dloss::comm {

/// What checks a guarded group's ops. Each hook runs on the thread that
/// calls the op, and refuses it by throwing.
struct GuardHooks {
  /// Before collective `call` runs on every rank.
  std::function<void(const std::string &call)> collective;
  /// When a send (`send`) to or a recv from `peer` with `tag` is posted:
  /// records it, and returns a token for `verify`.
  std::function<int64_t(const std::string &call, int peer, bool send, int tag)>
      post;
  /// Before the first wait of posted op `token`: compares it with its
  /// peer's record.
  std::function<void(int64_t token)> verify;
};

/// Registers on `group`, in place of its backends, one that checks each op
/// with `hooks` and then runs it on the group's backend for the tensors'
/// device (ops with no tensor, such as barrier, on the group's default
/// backend). It takes c10d's CUSTOM backend type, the one slot a group of
/// torch's backends leaves free: a group whose backend is a custom one
/// cannot be guarded (dloss::Error). Guarding a guarded group replaces its
/// hooks.
void guardGroup(c10d::ProcessGroup &group, GuardHooks hooks);

/// Gives `group` its own backends back; false when it was not guarded. The
/// guarded backend stays in the group's table, idle, for a later guard.
bool unguardGroup(c10d::ProcessGroup &group);

/// Whether `group` has a backend for `device`: ProcessGroup's own
/// hasBackendForDeviceType, which torch 2.11 lacks.
bool hasBackend(const c10d::ProcessGroup &group, c10::DeviceType device);

/// The backend that moves `group`'s tensors of `device` (looking through a
/// GuardedBackend); null when the group has none for that device type.
c10::intrusive_ptr<c10d::Backend> movingBackend(c10d::ProcessGroup &group,
                                                c10::DeviceType device);

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_GUARDEDBACKEND_H
