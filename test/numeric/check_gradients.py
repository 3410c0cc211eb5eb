#!/usr/bin/python3
"""Checks dloss-derived gradients against torch.autograd, on simulated ranks.

For every loss (`dloss.loss`) in an .mlir file:

  reference  the loss as written, run on ONE rank on the concatenated global
             batch (replicated arguments as they are) under torch.autograd:
             the single-device function F of the global batch and dF/dx;
  derived    `dloss-opt --dloss-derive-backward`'s @<name>_grad, run on N
             simulated ranks (dloss_sim.py) on the same data split by rank.

and compares them under the gradient contract (shared/DESIGN.md):

  loss                 equal to F on every rank;
  grad_mode "ddp"      varying x: rank r holds N * (rows of rank r of dF/dx);
                       replicated theta: the mean over ranks is dF/dtheta;
  grad_mode "global"   varying x: rank r holds its rows of dF/dx;
                       replicated theta: dF/dtheta on every rank.

It also runs the forward loss itself on N ranks and requires it to equal F:
when that fails the test program is not a valid SPMD loss (its meaning
changes with N), which is a bug in the test, not in the compiler.

Run by hand (Debian's python3 has torch; the one on PATH may not):

  /usr/bin/python3 test/numeric/check_gradients.py examples/clip.mlir \
      --dloss-opt build/bin/dloss-opt --world-sizes 1,2,3,4 --batch-sizes 5,3,7,1

Extra options can live in the .mlir file as lines `// NUMERIC-ARGS: ...`
(read before the command line, which overrides them).

Exit status: 0 all match, 1 a mismatch, 2 a usage or test-program error,
77 torch is missing (ctest's SKIP_RETURN_CODE).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)

# The tensors are tiny; one thread avoids oversubscription under `ctest -j`.
torch.set_num_threads(1)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dloss_sim as sim  # noqa: E402


class CheckError(Exception):
    """A problem with the test itself (bad program, bad options)."""


def parse_args(argv, file_args):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help=".mlir file with dloss.loss functions")
    p.add_argument("--dloss-opt", default=os.environ.get("DLOSS_OPT", "dloss-opt"),
                   help="the dloss-opt binary (default: $DLOSS_OPT or PATH)")
    p.add_argument("--world-sizes", default="1,2,3,4",
                   help="comma-separated numbers of ranks to check")
    p.add_argument("--batch-sizes", default="5,3,7,1",
                   help="per-rank batch sizes (axis 0 of varying `?` dims), "
                        "cycled when there are more ranks")
    p.add_argument("--features", type=int, default=5,
                   help="size of every other `?` dim")
    p.add_argument("--classes", type=int, default=6,
                   help="axis-0 size of replicated arguments with a `?` axis 0 "
                        "(ArcFace's class weights)")
    p.add_argument("--label-range", type=int, default=None,
                   help="integer arguments are drawn from [0, this); default: "
                        "the row count of the first replicated 2-D float "
                        "argument (the class weights), else --features")
    p.add_argument("--tie-rows", action="store_true",
                   help="row 0 of every varying float argument is the same "
                        "large row on every rank (global maxima tied across "
                        "ranks, once per rank) and row 1 the same small row "
                        "(tied minima)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="standard deviation of the random float inputs")
    p.add_argument("--func", default=None, help="check only this loss")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-9,
                   help="relative error tolerance (max-norm, float64)")
    p.add_argument("--tamper", nargs=2, action="append", default=[],
                   metavar=("REGEX", "REPLACEMENT"),
                   help="self-test of the checker: rewrite the derived IR "
                        "(generic form) with re.sub before running it")
    p.add_argument("--corrupt", default=None, metavar="ARG",
                   help="self-test of the checker: add 1e-6 of noise to the "
                        "derived gradient of ARG (a name or index), which must "
                        "then fail")
    return p.parse_args(file_args + argv)


def file_directives(path):
    args = []
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*//\s*NUMERIC-ARGS:(.*)", line)
            if m:
                args += shlex.split(m.group(1))
    return args


def dloss_opt(opt, path, *flags):
    proc = subprocess.run([opt, path, *flags, "--mlir-print-op-generic"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckError(f"{opt} {path} {' '.join(flags)} failed:\n{proc.stderr}")
    return proc.stdout


def source_arg_names(path, func_name, count):
    """The argument names as written (the generic form renumbers them)."""
    text = open(path).read()
    m = re.search(r"func\.func\s+@" + re.escape(func_name) + r"\s*\(", text)
    if m:
        start = m.end() - 1
        body = text[start + 1:sim.match_bracket(text, start) - 1]
        names = [re.match(r"\s*%([\w$.-]+)", a) for a in sim.split_top(body)]
        if len(names) == count and all(names):
            return [n.group(1) for n in names]
    return [f"arg{i}" for i in range(count)]


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------

def is_replicated(func, i):
    return bool(func.arg_attrs[i].get("dloss.replicated"))


def make_inputs(func, batch_sizes, opts, gen):
    """Per-rank argument lists for len(batch_sizes) ranks."""
    world = len(batch_sizes)
    label_range = opts.label_range
    if label_range is None:
        label_range = opts.features
        for i, t in enumerate(func.arg_types):
            if (is_replicated(func, i) and isinstance(t, sim.TensorType)
                    and t.is_float and len(t.shape) == 2):
                label_range = t.shape[0] if t.shape[0] is not None else opts.classes
                break

    def shape_of(t, batch, replicated):
        dims = []
        for axis, d in enumerate(t.shape):
            if d is not None:
                dims.append(d)
            elif axis == 0:
                dims.append(opts.classes if replicated else batch)
            else:
                dims.append(opts.features)
        return dims

    def sample(t, shape):
        if t.is_float:
            return torch.randn(shape, dtype=sim.FLOAT, generator=gen) * opts.scale
        return torch.randint(0, label_range, shape, dtype=sim.INT, generator=gen)

    per_rank = [[] for _ in range(world)]
    for i, t in enumerate(func.arg_types):
        if not isinstance(t, sim.TensorType):
            raise CheckError(f"argument {i} of @{func.name} has type {t}; only "
                             "tensor arguments can be generated")
        if is_replicated(func, i):
            value = sample(t, shape_of(t, None, True))
            for r in range(world):
                per_rank[r].append(value.clone())
            continue
        if not t.shape:
            raise CheckError(f"argument {i} of @{func.name} is a varying 0-d "
                             "tensor: it has no batch axis to split")
        tie_max = tie_min = None
        if opts.tie_rows and t.is_float:
            row_shape = shape_of(t, 1, False)[1:]
            tie_max = 10.0 + 0.1 * torch.rand(row_shape, dtype=sim.FLOAT, generator=gen)
            tie_min = -10.0 - 0.1 * torch.rand(row_shape, dtype=sim.FLOAT, generator=gen)
        for r in range(world):
            value = sample(t, shape_of(t, batch_sizes[r], False))
            if tie_max is not None:
                value[0] = tie_max
                if value.shape[0] > 1:
                    value[1] = tie_min
            per_rank[r].append(value)
    return per_rank


def global_inputs(func, per_rank):
    """The single-device arguments: varying ones concatenated in rank order."""
    out = []
    for i in range(len(func.arg_types)):
        if is_replicated(func, i):
            out.append(per_rank[0][i].clone())
        else:
            out.append(torch.cat([vals[i] for vals in per_rank], dim=0))
    return out


# ----------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------

def rel_error(got, expected):
    """max|got - expected| / max|expected| (floored), and where it is worst."""
    if tuple(got.shape) != tuple(expected.shape):
        return float("inf"), f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got = got.detach().to(sim.FLOAT)
    expected = expected.detach().to(sim.FLOAT)
    if got.numel() == 0:
        return 0.0, ""
    if not torch.isfinite(got).all():
        return float("inf"), "non-finite values in the result"
    diff = (got - expected).abs()
    scale = max(expected.abs().max().item(), 1e-12)
    err = diff.max().item() / scale
    idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    where = (f"worst at {list(idx)}: expected {expected[idx].item():.17g}, "
             f"got {got[idx].item():.17g}")
    return err, where


class Report:
    def __init__(self, tol):
        self.tol = tol
        self.failures = []
        self.worst = 0.0

    def check(self, label, got, expected):
        err, where = rel_error(got, expected)
        self.worst = max(self.worst, err)
        ok = err <= self.tol
        if not ok:
            self.failures.append(f"{label}: relative error {err:.3g} > {self.tol:g}; {where}")
        return err


def check_loss(path, fwd, grad_fn, arg_names, world, opts, gen, report, corrupt):
    batch = [int(b) for b in opts.batch_sizes.split(",")]
    batch_sizes = [batch[r % len(batch)] for r in range(world)]
    tag = f"{os.path.basename(path)} @{fwd.name} N={world} batches={batch_sizes}"
    per_rank = make_inputs(fwd, batch_sizes, opts, gen)

    # Reference: the single-device function of the global batch.
    ref_in = global_inputs(fwd, per_rank)
    grad_args = [i for i, a in enumerate(fwd.arg_attrs) if a.get("dloss.grad")]
    for i in grad_args:
        ref_in[i].requires_grad_(True)
    (ref_loss,) = sim.run_spmd(fwd, [ref_in], single_device=True)[0]
    if ref_loss.requires_grad:  # false when no dloss.grad argument reaches it
        ref_loss.backward()
    ref_grads = {i: (ref_in[i].grad if ref_in[i].grad is not None
                     else torch.zeros_like(ref_in[i])) for i in grad_args}
    ref_loss = ref_loss.detach()
    for i, g in ref_grads.items():
        if not torch.isfinite(g).all():
            raise CheckError(f"{tag}: the reference gradient of {arg_names[i]} is "
                             "not finite; choose inputs where the loss is smooth")

    # The test program must mean the same on N ranks (see the module doc).
    with torch.no_grad():
        fwd_out = sim.run_spmd(fwd, [[v.clone() for v in vals] for vals in per_rank])
    for r in range(world):
        err, _ = rel_error(fwd_out[r][0], ref_loss)
        if err > opts.tol:
            raise CheckError(
                f"{tag}: the forward loss on rank {r} ({fwd_out[r][0].item():.17g}) "
                f"differs from the single-device loss ({ref_loss.item():.17g}): the "
                "test program's meaning depends on the number of ranks (or the "
                "simulator's collectives are wrong)")

    # A derived function that cannot even run (a shape mismatch, an index out
    # of range) is a compiler bug like a wrong value, so it is a mismatch.
    try:
        with torch.no_grad():
            outs = sim.run_spmd(grad_fn, [[v.clone() for v in vals] for vals in per_rank])
    except sim.SimError as e:
        report.failures.append(f"{tag}: the derived @{grad_fn.name} fails on "
                               f"{world} ranks: {e}")
        return
    if len(outs[0]) != 1 + len(grad_args):
        report.failures.append(f"{tag}: @{grad_fn.name} returns {len(outs[0])} "
                               f"values, expected 1 + {len(grad_args)}")
        return
    if corrupt is not None:
        k = 1 + grad_args.index(corrupt)
        for r in range(world):
            g = outs[r][k]
            outs[r][k] = g + 1e-6 * g.abs().max() * torch.randn(g.shape, dtype=g.dtype,
                                                               generator=gen)

    mode = fwd.grad_mode
    if mode not in ("ddp", "global"):
        raise CheckError(f"@{fwd.name}: unknown dloss.grad_mode '{mode}'")
    worst = {}
    worst["loss"] = max(report.check(f"{tag}: loss on rank {r}", outs[r][0], ref_loss)
                        for r in range(world))
    offsets = [sum(batch_sizes[:r]) for r in range(world)]
    for k, i in enumerate(grad_args, start=1):
        name = arg_names[i]
        ref = ref_grads[i]
        if is_replicated(fwd, i):
            if mode == "ddp":
                mean = sum(outs[r][k] for r in range(world)) / world
                e = report.check(f"{tag}: d/d{name} (replicated, ddp: mean over "
                                 "ranks)", mean, ref)
            else:
                e = max(report.check(f"{tag}: d/d{name} (replicated, global) on "
                                     f"rank {r}", outs[r][k], ref)
                        for r in range(world))
        else:
            scale = world if mode == "ddp" else 1
            e = 0.0
            for r in range(world):
                rows = ref.narrow(0, offsets[r], per_rank[r][i].shape[0])
                e = max(e, report.check(
                    f"{tag}: d/d{name} (varying, {mode}) on rank {r}: expected "
                    f"{'N * ' if scale != 1 else ''}rows "
                    f"[{offsets[r]}, {offsets[r] + rows.shape[0]}) of dF/d{name}",
                    outs[r][k], rows * scale))
        worst[name] = e
    summary = ", ".join(f"{n} {e:.1e}" for n, e in worst.items())
    print(f"{tag} [{mode}]: max rel. error {summary}")


def main(argv):
    # The file's own directives first, so that the command line overrides them.
    path = parse_args(argv, []).file
    opts = parse_args(argv, file_directives(path) if os.path.exists(path) else [])
    gen = torch.Generator().manual_seed(opts.seed)
    try:
        source = sim.parse_module(dloss_opt(opts.dloss_opt, opts.file))
        derived_text = dloss_opt(opts.dloss_opt, opts.file, "--dloss-derive-backward")
        for regex, replacement in opts.tamper:
            derived_text, count = re.subn(regex, replacement, derived_text)
            if not count:
                raise CheckError(f"--tamper: '{regex}' matches nothing")
        derived = sim.parse_module(derived_text)
        losses = [f for f in source.values() if f.attrs.get("dloss.loss")]
        if opts.func:
            losses = [f for f in losses if f.name == opts.func]
        if not losses:
            raise CheckError(f"{opts.file}: no dloss.loss function to check")
        report = Report(opts.tol)
        for fwd in losses:
            if fwd.name + "_grad" not in derived:
                raise CheckError(f"dloss-opt derived no @{fwd.name}_grad")
            for op in fwd.ops:
                if op.name == "dloss.all_gather" and sim.GATHER_GRADS[op.attr("grad", 0)] != "exact":
                    raise CheckError(
                        f"@{fwd.name} has an all_gather with grad "
                        f"{sim.GATHER_GRADS[op.attr('grad')]}: its gradient differs "
                        "from single-device training by design, so this oracle "
                        "does not apply")
            names = source_arg_names(opts.file, fwd.name, len(fwd.arg_types))
            corrupt = None
            if opts.corrupt is not None:
                corrupt = (int(opts.corrupt) if opts.corrupt.isdigit()
                           else names.index(opts.corrupt))
            for world in [int(w) for w in opts.world_sizes.split(",")]:
                check_loss(opts.file, fwd, derived[fwd.name + "_grad"], names,
                           world, opts, gen, report, corrupt)
    except (CheckError, sim.SimError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    if report.failures:
        print(f"FAIL: {len(report.failures)} mismatch(es) between the derived "
              "gradients and torch.autograd:", file=sys.stderr)
        for f in report.failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"PASS: worst relative error {report.worst:.2e} (tolerance {opts.tol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
