#!/usr/bin/env python3
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

Through the real runtime (--runtime DLOSS_RUN): the derived side is then not
the simulator but `dloss-run LOSS.mlir --world N` (the compiled plan, N real
processes over Gloo). The same per-rank inputs are written as .npy files in
the IR's element types (f32 arguments in float32, f64 in float64, integers
as declared; the reference sees exactly those rounded values), every rank's
loss (result.json) and gradients (grad_<NAME>.npy, always float32) are read
back and compared with the same torch.autograd reference under the same
contract. The tolerance then fits the narrowest floating-point type of the
loss (f32: 1e-4 at the gradient's scale; f64: 1e-6, as the gradients come
back in float32; bf16/f16 wider):

  /usr/bin/python3 test/numeric/check_gradients.py test/numeric/rules/ring_shift.mlir \
      --dloss-opt build/bin/dloss-opt --runtime build/bin/dloss-run \
      --world-sizes 1,2,3,4 --keep-runs /tmp/ring_shift

Many checks in one process (--check, repeatable): each --check is one run's
own arguments, a name first, split like a shell; the options outside them are
common to every check and come last (so they win). The checks run one after
the other exactly as separate runs would (each seeds its own generator), but
Python and torch start once: ctest runs each family of checks this way.

  /usr/bin/python3 test/numeric/check_gradients.py --dloss-opt build/bin/dloss-opt \
      --check "rule-casts test/numeric/rules/casts.mlir" \
      --check "clip-n3 examples/clip.mlir --world-sizes 3"

Every check's result is printed under its name, a failure with the loss and
N it concerns; the last lines name the checks that failed, each with the
command that reruns it alone.

Exit status: 0 all match, 1 a mismatch (a dloss-run that fails or times out
counts as one), 2 a usage or test-program error, 77 torch (or, with
--runtime, numpy) is missing (ctest's SKIP_RETURN_CODE). With --check: the
worst of the checks' statuses (2 over 1 over 0).
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)

# The tensors are tiny; one thread avoids oversubscription under `ctest -j`.
torch.set_num_threads(1)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import dloss_sim as sim  # noqa: E402  (it needs numpy too)
except ImportError as e:
    print("SKIP:", e, "with", sys.executable)
    sys.exit(77)

# The simulator's own tolerance (float64 against float64).
SIM_TOL = 1e-9

# --runtime: element types of .npy inputs, and the default tolerance by the
# narrowest floating-point type a loss computes in (relative to the
# gradient's max-norm). dloss-run returns gradients in float32, so even an
# f64 loss cannot match better than float32 rounding (6e-8).
NPY_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64,
              "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
              "i64": np.int64, "ui8": np.uint8}
RUNTIME_TOLS = {"f64": 1e-6, "f32": 1e-4, "tf32": 1e-3, "f16": 1e-2, "bf16": 3e-2}


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
    p.add_argument("--tol", type=float, default=None,
                   help="relative error tolerance (max-norm); default 1e-9 "
                        "for the simulator, with --runtime one that fits the "
                        "loss's narrowest float type (f32: 1e-4, f64: 1e-6)")
    p.add_argument("--runtime", default=None, metavar="DLOSS_RUN",
                   help="check the real runtime: run the loss with this "
                        "dloss-run binary on N local Gloo ranks instead of "
                        "the derived IR in the simulator")
    p.add_argument("--runtime-flag", action="append", default=[], metavar="FLAG",
                   help="with --runtime: extra dloss-run flags, split like a "
                        "shell (repeatable; the self-test passes '--grad-mode "
                        "global' for a ddp loss, which must then fail)")
    p.add_argument("--no-fuse", action="store_true",
                   help="derive without dloss-fuse-gather-similarity "
                        "(dloss-derive-backward{fuse=false}; with --runtime, "
                        "dloss-run --no-fuse): the unfused ops' rules")
    p.add_argument("--runtime-timeout", type=int, default=120,
                   help="with --runtime: seconds one dloss-run may take")
    p.add_argument("--keep-runs", default=None, metavar="DIR",
                   help="with --runtime: keep the inputs and dloss-run outputs "
                        "in DIR/<func>/n<N> (default: a temporary directory, "
                        "removed)")
    p.add_argument("--tamper", nargs=2, action="append", default=[],
                   metavar=("REGEX", "REPLACEMENT"),
                   help="self-test of the checker: rewrite the derived IR "
                        "(generic form) with re.sub before running it")
    p.add_argument("--corrupt", default=None, metavar="ARG",
                   help="self-test of the checker: add 1e-6 of noise to the "
                        "derived gradient of ARG (a name or index), which must "
                        "then fail; with --runtime, 10 times the tolerance, "
                        "written into the last rank's grad_ARG.npy file "
                        "before it is read back")
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
    if not torch.isfinite(expected).all():
        return float("inf"), "non-finite values in the reference"
    diff = (got - expected).abs()
    scale = max(expected.abs().max().item(), 1e-12)
    err = diff.max().item() / scale
    idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    where = (f"worst at {list(idx)}: expected {expected[idx].item():.17g}, "
             f"got {got[idx].item():.17g}")
    return err, where


class Report:
    def __init__(self, tol):
        self.tol = tol  # None: set per loss (--runtime)
        self.failures = []
        self.worst = 0.0
        self.tols = set()

    def check(self, label, got, expected):
        err, where = rel_error(got, expected)
        self.worst = max(self.worst, err)
        self.tols.add(self.tol)
        ok = err <= self.tol
        if not ok:
            self.failures.append(f"{label}: relative error {err:.3g} > {self.tol:g}; {where}")
        return err


# ----------------------------------------------------------------------------
# The real runtime (--runtime)
# ----------------------------------------------------------------------------

def float_types(func):
    """Every floating-point element type the loss computes in."""
    types = list(func.arg_types) + [t for op in func.ops for t in op.result_types]
    return {t.elem for t in types if isinstance(t, sim.TensorType) and t.is_float}


def runtime_tol(func):
    tols = [RUNTIME_TOLS.get(e, 3e-2) for e in float_types(func)]
    return max(tols) if tols else RUNTIME_TOLS["f32"]


def npy_dtype(func, i, name):
    t = func.arg_types[i]
    if t.elem not in NPY_DTYPES:
        raise CheckError(f"argument {name} of @{func.name} has element type "
                         f"{t.elem}, which has no .npy dtype to give dloss-run")
    return NPY_DTYPES[t.elem]


def round_to_ir_types(func, per_rank, names):
    """The inputs as the runtime will see them: rounded to the IR's element
    types (and back to the simulator's float64), so that the reference is
    computed on exactly the values that dloss-run reads."""
    for vals in per_rank:
        for i, v in enumerate(vals):
            if func.arg_types[i].is_float:
                rounded = v.numpy().astype(npy_dtype(func, i, names[i]))
                vals[i] = torch.from_numpy(rounded.astype(np.float64))


class RuntimeFailure(Exception):
    """dloss-run failed, timed out, or wrote unreadable results."""

    def __init__(self, message, compile_failed=False):
        super().__init__(message)
        self.compile_failed = compile_failed  # the same for every N


def run_runtime(opts, fwd, names, per_rank, grad_args, run_dir, corrupt, gen, tol):
    """Runs the loss with dloss-run on len(per_rank) ranks; returns, per rank,
    [loss, grad of each dloss.grad argument] as float64 tensors."""
    world = len(per_rank)
    in_dir = os.path.join(run_dir, "inputs")
    out_dir = os.path.join(run_dir, "out")
    os.makedirs(in_dir, exist_ok=True)
    cmd = [os.path.abspath(opts.runtime), os.path.abspath(opts.file), "--world", str(world),
           "--entry", fwd.name, "--iters", "0",
           "--timeout", str(max(10, opts.runtime_timeout // 2)), "--out", out_dir]
    for i, name in enumerate(names):
        t = fwd.arg_types[i]
        dtype = npy_dtype(fwd, i, name)
        if is_replicated(fwd, i):
            value = per_rank[0][i]
            if not t.shape and t.is_float:
                # A replicated scalar inline, as users pass one (exact: the
                # float32 value round-trips through repr and strtod).
                cmd += ["--input", f"{name}={float(value.item())!r}"]
                continue
            path = os.path.join(in_dir, f"{name}.npy")  # one file for all ranks
            np.save(path, value.numpy().astype(dtype))
        else:
            for r in range(world):
                np.save(os.path.join(in_dir, f"{name}.rank{r}.npy"),
                        per_rank[r][i].numpy().astype(dtype))
            path = os.path.join(in_dir, f"{name}.rank{{rank}}.npy")
        cmd += ["--input", f"{name}={path}"]
    for flags in opts.runtime_flag + (["--no-fuse"] if opts.no_fuse else []):
        cmd += shlex.split(flags)
    shown = " ".join(shlex.quote(c) for c in cmd)
    with open(os.path.join(run_dir, "command.sh"), "w") as f:
        f.write(shown + "\n")
    # Its own session, so that a hang takes its rank processes down with it.
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    except OSError as e:
        raise RuntimeFailure(f"dloss-run could not be started ({e}): {shown}") from None
    try:
        output, _ = proc.communicate(timeout=opts.runtime_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeFailure(f"dloss-run did not finish in {opts.runtime_timeout} s "
                             f"(killed): {shown}") from None
    if proc.returncode != 0:
        raise RuntimeFailure(f"dloss-run exited with status {proc.returncode}:\n"
                             f"    {shown}\n" + "".join(
                                 "    | " + line + "\n" for line in output.splitlines()),
                             compile_failed="' did not compile:" in output)
    if corrupt is not None:
        # Self-test: noise of 10x the tolerance in the last rank's file.
        path = os.path.join(out_dir, f"rank{world - 1}", f"grad_{names[corrupt]}.npy")
        g = np.load(path)
        noise = torch.randn(g.shape, dtype=torch.float64, generator=gen).numpy()
        np.save(path, (g + 10 * tol * max(np.abs(g).max(), 1e-6) * noise).astype(g.dtype))
    outs = []
    for r in range(world):
        rank_dir = os.path.join(out_dir, f"rank{r}")
        try:
            with open(os.path.join(rank_dir, "result.json")) as f:
                result = json.load(f)
            vals = [torch.tensor(float(result["loss"]), dtype=torch.float64)]
            for i in grad_args:
                g = np.load(os.path.join(rank_dir, f"grad_{names[i]}.npy"))
                vals.append(torch.from_numpy(np.asarray(g, dtype=np.float64)))
        except (OSError, ValueError, KeyError) as e:
            raise RuntimeFailure(f"rank {r}'s results in {rank_dir} are missing "
                                 f"or unreadable ({e}); command: {shown}") from None
        outs.append(vals)
    return outs


def check_loss(path, fwd, grad_fn, arg_names, world, opts, gen, report, corrupt,
               run_dir=None):
    batch = [int(b) for b in opts.batch_sizes.split(",")]
    batch_sizes = [batch[r % len(batch)] for r in range(world)]
    tag = f"{os.path.basename(path)} @{fwd.name} N={world} batches={batch_sizes}"
    if opts.runtime:
        tag += " (dloss-run)"
    per_rank = make_inputs(fwd, batch_sizes, opts, gen)
    if opts.runtime:
        round_to_ir_types(fwd, per_rank, arg_names)

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
        if err > (SIM_TOL if opts.runtime else report.tol):
            raise CheckError(
                f"{tag}: the forward loss on rank {r} ({fwd_out[r][0].item():.17g}) "
                f"differs from the single-device loss ({ref_loss.item():.17g}): the "
                "test program's meaning depends on the number of ranks (or the "
                "simulator's collectives are wrong)")

    if opts.runtime:
        # A run that fails (a crash, a shape error, a hang) is a runtime or
        # compiler bug like a wrong value, so it is a mismatch.
        try:
            outs = run_runtime(opts, fwd, arg_names, per_rank, grad_args, run_dir,
                               corrupt, gen, report.tol)
        except RuntimeFailure as e:
            report.failures.append(f"{tag}: {e}")
            print(f"{tag}: dloss-run FAILED" +
                  (" (the loss did not compile)" if e.compile_failed else ""))
            return "compile-failed" if e.compile_failed else None
        corrupt = None  # already done, in the file
    else:
        # A derived function that cannot even run (a shape mismatch, an index
        # out of range) is a compiler bug like a wrong value, so a mismatch.
        try:
            with torch.no_grad():
                outs = sim.run_spmd(grad_fn, [[v.clone() for v in vals]
                                              for vals in per_rank])
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
    print(f"{tag} [{mode}]: max rel. error {summary} (tolerance {report.tol:g})")


def main(argv):
    # The file's own directives first, so that the command line overrides them.
    path = parse_args(argv, []).file
    opts = parse_args(argv, file_directives(path) if os.path.exists(path) else [])
    gen = torch.Generator().manual_seed(opts.seed)
    runs_root = None
    try:
        if opts.runtime:
            if opts.tamper:
                raise CheckError("--tamper rewrites the IR that the simulator runs; "
                                 "with --runtime use --corrupt or --runtime-flag")
            if not (os.path.isfile(opts.runtime) and os.access(opts.runtime, os.X_OK)):
                raise CheckError(f"--runtime {opts.runtime}: not an executable file")
            if opts.keep_runs:
                runs_root = os.path.abspath(opts.keep_runs)
            else:
                runs_root = tempfile.mkdtemp(prefix="dloss-numeric-runtime-")
        elif opts.runtime_flag or opts.keep_runs:
            raise CheckError("--runtime-flag and --keep-runs need --runtime")
        source = sim.parse_module(dloss_opt(opts.dloss_opt, opts.file))
        derived_text = dloss_opt(opts.dloss_opt, opts.file,
                                 "--dloss-derive-backward=fuse=false" if opts.no_fuse
                                 else "--dloss-derive-backward")
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
            if opts.tol is None:
                report.tol = runtime_tol(fwd) if opts.runtime else SIM_TOL
            if fwd.name + "_grad" not in derived:
                raise CheckError(f"dloss-opt derived no @{fwd.name}_grad")
            for op in fwd.ops:
                if op.name == "dloss.all_gather" and op.attr("grad", "exact") != "exact":
                    raise CheckError(
                        f"@{fwd.name} has an all_gather with grad "
                        f"{op.attr('grad')}: its gradient differs "
                        "from single-device training by design, so this oracle "
                        "does not apply")
            names = source_arg_names(opts.file, fwd.name, len(fwd.arg_types))
            corrupt = None
            if opts.corrupt is not None:
                corrupt = (int(opts.corrupt) if opts.corrupt.isdigit()
                           else names.index(opts.corrupt))
            for world in [int(w) for w in opts.world_sizes.split(",")]:
                run_dir = None
                if runs_root:
                    run_dir = os.path.join(runs_root, fwd.name, f"n{world}")
                    shutil.rmtree(run_dir, ignore_errors=True)
                status = check_loss(opts.file, fwd, derived[fwd.name + "_grad"],
                                    names, world, opts, gen, report, corrupt, run_dir)
                if status == "compile-failed":
                    print(f"@{fwd.name}: not run on the other world sizes (the "
                          "same plan would be compiled)")
                    break
    except (CheckError, sim.SimError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    finally:
        if runs_root and not opts.keep_runs:
            shutil.rmtree(runs_root, ignore_errors=True)
    sys.stdout.flush()
    if report.failures:
        print(f"FAIL: {len(report.failures)} mismatch(es) between the derived "
              "gradients and torch.autograd:", file=sys.stderr)
        for f in report.failures:
            print("  " + f, file=sys.stderr)
        if opts.runtime and not opts.keep_runs:
            print("  (rerun with --keep-runs DIR to keep each run's inputs, "
                  "outputs and dloss-run command)", file=sys.stderr)
        return 1
    tols = "/".join(f"{t:g}" for t in sorted(report.tols)) or f"{report.tol:g}"
    print(f"PASS: worst relative error {report.worst:.2e} (tolerance {tols})")
    return 0


def main_checks(argv):
    """--check NAME... (repeatable): every check in this process, in order."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--check", action="append", default=[])
    known, common = p.parse_known_args(argv)
    verdicts = {0: "PASS", 1: "FAIL", 2: "ERROR"}
    failed = []
    status = 0
    for check in known.check:
        name, *args = shlex.split(check)
        print(f"=== {name}", flush=True)
        try:
            rc = main(args + common)
        except SystemExit as e:  # argparse: a bad option in this check
            rc = 2 if e.code else 0
        except Exception:  # noqa: BLE001 - a crash in one check is its own ERROR
            traceback.print_exc()
            rc = 2
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"=== {name}: {verdicts.get(rc, f'exit {rc}')}", flush=True)
        if rc:
            rerun = [sys.executable, os.path.abspath(__file__)] + args + common
            failed.append(f"{name} (rerun alone: {shlex.join(rerun)})")
            status = max(status, rc)
    if failed:
        print(f"FAIL: {len(failed)} of {len(known.check)} checks:", file=sys.stderr)
        for f in failed:
            print("  " + f, file=sys.stderr)
    else:
        print(f"PASS: all {len(known.check)} checks")
    return status


if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(main_checks(argv) if any(a == "--check" or a.startswith("--check=")
                                      for a in argv) else main(argv))
