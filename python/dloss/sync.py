"""dloss.assert_grads_synced: after backward(), check that every parameter's
gradient is bit-for-bit the same on every rank."""

import torch

from .errors import caller_location, make_error
from .group import communicator

# Per parameter: whether it has a gradient, its element count, and two
# checksums of its bytes. Each sums the gradient's 16-bit words times
# pseudo-random weights, so that changes cancel only by chance (about 2^-24
# for each checksum), where a plain or position-weighted sum misses small
# patterns such as +1, -1, -1, +1 ulp on four elements.
_WIDTH = 4
_CHUNK = 1 << 20  # words per step: bounds the temporaries to a few MB
_MODULUS = (1 << 61) - 1  # the checksums cross as int64
_SALTS = (0x2545F491, 0x6C078965)
_chunk_weights = {}  # device -> [2, _CHUNK] int32


def _hash(values, salt):
    """A multiply-xorshift hash of non-negative values below 2^31 into
    [1, 2^24]; every product stays below 2^63 (no int64 overflow)."""
    h = (values * 0x9E3779B1 + salt) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    return (h & 0xFFFFFF) + 1


def _weights(device):
    """The weights of a chunk's word positions, made once per device."""
    w = _chunk_weights.get(device)
    if w is None:
        positions = torch.arange(_CHUNK, device=device)
        w = torch.stack([_hash(positions, s) for s in _SALTS]).to(
            torch.int32)
        _chunk_weights[device] = w
    return w


def _named(params_or_module):
    if isinstance(params_or_module, torch.nn.Module):
        return list(params_or_module.named_parameters())
    if isinstance(params_or_module, dict):
        return list(params_or_module.items())
    if isinstance(params_or_module, torch.Tensor):
        return [("tensor", params_or_module)]
    items = list(params_or_module)
    if items and isinstance(items[0], tuple):
        return items
    return [("params[%d]" % i, p) for i, p in enumerate(items)]


def _fingerprint(p):
    g = p.grad if isinstance(p, torch.Tensor) else None
    if g is None:
        return [0, 0, 0, 0]
    data = g.detach().contiguous().reshape(-1).view(torch.uint8)
    words = data.view(torch.int16) if data.numel() % 2 == 0 else data
    weights = _weights(words.device)
    sums = []
    for start in range(0, words.numel(), _CHUNK):
        chunk = words[start:start + _CHUNK].to(torch.int64)
        # |word| < 2^15, weight <= 2^24, 2^20 terms: below 2^60.
        sums.append((chunk * weights[:, :chunk.numel()]).sum(1))
    # Chunk k's sums count m_k times (pseudo-random multipliers mod a
    # prime), so that equal changes in two chunks do not cancel either.
    totals = [0, 0]
    for k, pair in enumerate(torch.stack(sums).tolist() if sums else []):
        for i, value in enumerate(pair):
            totals[i] = (totals[i] + value * (
                _hash(k % 0x7FFFFFFF, _SALTS[i]) << 37 | k + 1)) % _MODULUS
    return [1, g.numel(), totals[0], totals[1]]


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(
        str(r) for r in ranks)


def assert_grads_synced(params_or_module, group=None):
    """Raises dloss.Error on every rank unless each parameter's ``.grad`` is
    identical on every rank.

    Call it after ``backward()`` (and after DDP has reduced). It exchanges
    one small collective of per-tensor fingerprints (two checksums: a
    difference goes unseen with a chance of about 2^-48), so it costs a pass
    over the gradients and no gradient traffic. The error names each parameter
    that differs and which ranks agree with which, which is how a
    desynchronised parameter (a loss parameter outside DDP, a teacher updated
    on one rank, a gradient hook that runs on some ranks) is found. Takes a
    module, a dict of named tensors, or an iterable of tensors or of (name,
    tensor) pairs; every rank must pass the same parameters in the same
    order.
    """
    location = caller_location(2)
    op = "dloss.assert_grads_synced"
    named = _named(params_or_module)
    problems = differing(named, group, op, location)
    if problems:
        comm = communicator(group)
        raise make_error(
            problem(problems, len(named)),
            "Wrap the module that owns them in DDP, or give them dloss's "
            "global gradient (dloss losses do for their own parameters); "
            "check for code that runs backward or edits .grad on some ranks "
            "only", rank=comm.rank, op=op, location=location)


def problem(problems, total):
    """The sentence of the error for differing()'s result."""
    return "gradients differ between ranks for %d of %d parameters: %s" % (
        len(problems), total, "; ".join(text for _, text in problems))


def differing(named, group, op, location):
    """The collective behind assert_grads_synced, for wrappers that explain
    more (dloss.lightning): [(name, "name differs: ranks ... vs ...")] for
    each of the (name, tensor) pairs whose gradient differs between ranks,
    the same list on every rank. Raises dloss.Error on every rank when the
    ranks pass different numbers of parameters."""
    comm = communicator(group)
    counts = comm.all_gather_ints([len(named)], op, location)
    if len(set(counts)) != 1:
        raise make_error(
            "the ranks passed different numbers of parameters: %s" %
            ", ".join("rank %d: %d" % (r, c) for r, c in enumerate(counts)),
            "Pass the same parameters on every rank", rank=comm.rank, op=op,
            location=location)
    row = []
    for _, p in named:
        row.extend(_fingerprint(p))
    table = comm.all_gather_ints(row, op, location) if row else []
    width = len(row)
    per_rank = [table[r * width:(r + 1) * width]
                for r in range(comm.world_size)]
    problems = []
    for i, (name, _) in enumerate(named):
        groups = {}
        for r in range(comm.world_size):
            key = tuple(per_rank[r][i * _WIDTH:(i + 1) * _WIDTH])
            groups.setdefault(key, []).append(r)
        if len(groups) == 1:
            continue
        parts = []
        sizes = {k[1] for k in groups if k[0]}
        for key, ranks in sorted(groups.items(), key=lambda kv: kv[1]):
            what = "no gradient" if key[0] == 0 else (
                "%d elements" % key[1] if len(sizes) > 1 else "one value")
            parts.append("%s (%s)" % (_ranks(ranks), what))
        problems.append((name, "%s differs: %s" % (name, " vs ".join(parts))))
    return problems
