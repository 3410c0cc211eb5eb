#!/usr/bin/env python3
"""Every example loss, fused vs unfused, and the fused CLIP step against the sgemm peak.

On N local Gloo ranks (dloss-run --world N, processes on loopback), fp32, for
each example loss examples/NAME.mlir of --examples it runs
  * fused:    dloss-run examples/NAME.mlir (the default plan),
  * unfused:  the same with --no-fuse (the plan materialises the similarity),
  * general:  (only with --variants ...,general) --general-fusion-only: CLIP,
              SigLIP and PartialFC through dloss.fused_similarity too,
on the same per-rank inputs, and reports the time of one forward+backward
(median of --repeat timed calls after one warm-up call) and the loss's memory
per rank, the worst rank of each, two ways: per step (the later calls' peak
RSS minus the RSS after the first call, its freed heap returned: the memory
target is judged on this) and from the first call on (peak RSS minus the RSS
right before it, which also holds what the process sets up once: code pages,
thread pools, Gloo's buffers; about 12-14 MiB here). `dlossc --emit=plan-text` says which fused ops each plan has. Then,
right after CLIP's fused run and under the same conditions (the same ranks
running at once, the same intra-op threads each), dloss-bench-gemm-peak times
the four plain at::mm of the fused CLIP step's shapes (1 forward + 3 backward
GEMMs of n x M x d multiply-adds per rank, n = B_local, M = B_global); their
time over the fused step's is the fraction of the sgemm peak it reaches.

The sizes: every family's similarity per rank is B_local x B_global, CLIP's:
ArcFace has B_global replicated classes; PartialFC B_local classes in all,
sharded over the ranks (its gathered B_global x C matrix); NT-Xent's B_local
rows per rank are its two views of B_local / 2 rows each; SupCon's labels come
from B_global / 8 classes (every anchor has positives).

Prints a markdown table (one row per family) and one verdict line per target,
writes OUT/families.csv. Exits 1 if a run failed (its row says why); a target
not met is reported, not an error. A missing example file is a row
"missing". Skip rule as in run_clip_bench.py: a plan whose estimated loss
memory for N ranks exceeds the available RAM is not run (--force runs it).

usage: bench/run_family_bench.py [--examples clip,siglip,...] [--b-local 4096]
                                 [--dim 256] [--world 4] [--repeat 3] ...
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
MB = 1024 * 1024  # the tools' "MB" are MiB

# The issue's targets (fusion-general, issue 13).
TARGET_MEM_RATIO = 1 / 20  # fused loss memory <= 1/20 of unfused
TARGET_TIME_RATIO = 0.6  # fused time <= 0.6x unfused
TARGET_PEAK_FRACTION = 0.9  # fused CLIP >= 90% of the sgemm peak

FUSED_OPS = re.compile(r"dloss\.(fused_similarity|ring_softmax_ce|ring_sigmoid_pairs|"
                       r"sharded_softmax)(_grad)?\b")

# ---- the families: how to make valid inputs for each example ---------------
#
# A recipe takes (b_local, world, dim, rng, io) and writes every argument of
# the loss with io.per_rank(name, arrays) / io.shared(name, array) /
# io.scalar(name, value). To add a family: add examples/NAME.mlir and a recipe
# here; an example without a recipe falls back to examples/run_example.py's
# (its small test sizes of classes).


class Inputs:
    """Writes .npy files under `dir` and collects dloss-run's --input arguments."""

    def __init__(self, dir):
        self.dir, self.args = dir, []

    def per_rank(self, name, arrays):
        for r, a in enumerate(arrays):
            np.save(os.path.join(self.dir, f"{name}{r}.npy"), a)
        self.args += ["--input", f"{name}={os.path.join(self.dir, name)}{{rank}}.npy"]

    def shared(self, name, array):
        np.save(os.path.join(self.dir, f"{name}.npy"), array)
        self.args += ["--input", f"{name}={os.path.join(self.dir, name)}.npy"]

    def scalar(self, name, value):
        self.args += ["--input", f"{name}={value}"]


def unit_rows(rng, rows, dim):
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def two_towers(first, second, **scalars):
    """Two per-rank unit-row feature sets (image/text, queries/keys) and scalars."""
    def recipe(b, world, dim, rng, io):
        for name in (first, second):
            io.per_rank(name, [unit_rows(rng, b, dim) for _ in range(world)])
        for name, value in scalars.items():
            io.scalar(name, value)
    return recipe


def arcface(b, world, dim, rng, io):
    classes = b * world  # replicated W [C, d]: the B_local x C logits are CLIP-sized
    io.per_rank("embeddings", [rng.standard_normal((b, dim), dtype=np.float32)
                               for _ in range(world)])
    io.per_rank("labels", [rng.integers(0, classes, size=b).astype(np.int64)
                           for _ in range(world)])
    io.shared("weights", rng.standard_normal((classes, dim), dtype=np.float32))


def partialfc(b, world, dim, rng, io):
    classes = max(b, world)  # the gathered B_global x C logits are CLIP-sized
    shards = [classes // world + (r < classes % world) for r in range(world)]
    io.per_rank("embeddings", [rng.standard_normal((b, dim), dtype=np.float32)
                               for _ in range(world)])
    io.per_rank("labels", [rng.integers(0, classes, size=b).astype(np.int64)
                           for _ in range(world)])
    io.per_rank("weights", [rng.standard_normal((c, dim), dtype=np.float32) for c in shards])


def ntxent(b, world, dim, rng, io):
    # B_local embeddings per rank, two views of B_local / 2: [u1; u2] x everyone's
    # is B_local x B_global, CLIP-sized.
    for view in ("z1", "z2"):
        io.per_rank(view, [unit_rows(rng, max(1, b // 2), dim) for _ in range(world)])


def supcon(b, world, dim, rng, io):
    classes = max(2, b * world // 8)  # about 8 rows per class: every anchor has positives
    io.per_rank("z", [unit_rows(rng, b, dim) for _ in range(world)])
    io.per_rank("y", [rng.integers(0, classes, size=b).astype(np.int64) for _ in range(world)])


RECIPES = {
    "clip": two_towers("image", "text", scale=14.285714),
    "siglip": two_towers("image", "text", log_t=2.302585, bias=-10.0),
    "partialfc": partialfc,
    "arcface": arcface,
    "ntxent": ntxent,
    "infonce": two_towers("q", "k", scale=14.285714),
    "supcon": supcon,
    "dcl": two_towers("q", "k", scale=14.285714),
}
DEFAULT_EXAMPLES = ",".join(RECIPES)

# k per family for the skip rule: the unfused plan's loss memory over one
# B_local x B_global fp32 matrix, measured with this script at B_local = 1024
# on 4 ranks (the fixed part included, so it overestimates at larger sizes).
# A family not listed gets DEFAULT_K.
PRIOR_K = {"clip": 12, "siglip": 12, "partialfc": 10, "arcface": 9, "ntxent": 9,
           "infonce": 9, "supcon": 13, "dcl": 13}
DEFAULT_K = 14.0


def make_inputs(name, b, world, dim, dir, seed):
    os.makedirs(dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    io = Inputs(dir)
    if name in RECIPES:
        RECIPES[name](b, world, dim, rng, io)
        return io.args, ""
    try:  # an example this script does not know yet: run_example.py's recipe
        from run_example import make_inputs as example_inputs
        args = []
        for i in example_inputs(f"{name}.mlir", [b] * world, dim, dir, rng):
            args += ["--input", i]
        return args, "inputs: examples/run_example.py's recipe"
    except SystemExit as e:
        raise RuntimeError(f"no input recipe for {name} (add one to RECIPES): {e}")


# ---- running ----------------------------------------------------------------

def run(cmd, env, timeout=None):
    """Runs a process; returns (ok, output)."""
    print("+ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return False, (e.stdout or "") + f"\ntimed out after {timeout} s"
    except OSError as e:  # a binary missing, or being relinked by a build
        return False, f"failed to start {cmd[0]}: {e}"
    if p.returncode != 0:
        print(p.stdout, end="", file=sys.stderr)
        print(f"run_family_bench.py: the command above failed ({p.returncode})", file=sys.stderr)
    return p.returncode == 0, p.stdout


def first_error(text):
    lines = [l for l in text.splitlines() if l.strip()]
    why = [l for l in lines if "error" in l.lower() or "failed" in l.lower()]
    return (why or lines[-1:] or ["no output"])[0].strip()


def fused_ops(dlossc, example, extra, env):
    """The fused ops of the plan dlossc makes (sorted, without _grad twins), or None."""
    ok, text = run([dlossc, example, "--emit=plan-text"] + extra, env)
    if not ok:
        return None, first_error(text)
    return sorted({m.group(1) for m in FUSED_OPS.finditer(text)}), ""


def bench_plan(a, dloss_run, example, extra, inputs, out, env):
    cmd = [dloss_run, example, "--world", str(a.world), "--iters", str(a.repeat),
           "--threads", str(a.threads), "--timeout", str(a.timeout), "--out", out] + extra + inputs
    ok, text = run(cmd, env)
    if not ok:
        return None, first_error(text)
    ranks = [json.load(open(os.path.join(out, f"rank{r}", "result.json"))) for r in range(a.world)]
    return dict(median_ms=max(r["median_ms"] for r in ranks),
                loss_mem_mb=max(r["loss_mem_mb"] for r in ranks),
                steady_mem_mb=max(r["steady_mem_mb"] for r in ranks),
                peak_rss_mb=max(r["peak_rss_mb"] for r in ranks),
                loss=ranks[0]["loss"],
                hwm_reset=all(r.get("hwm_reset", False) for r in ranks)), ""


def bench_peak(a, exe, tile, env, tmp):
    """The four plain GEMMs of the fused CLIP step on every rank at once; worst rank."""
    out = os.path.join(tmp, f"gemm_{tile}.json")
    cmd = [exe, "--world", str(a.world), "--b-local", str(a.b_local), "--dim", str(a.dim),
           "--iters", str(a.repeat), "--warmup", "1", "--threads", str(a.threads), "--out", out]
    if tile != "full":
        cmd += ["--tile", tile]
    ok, text = run(cmd, env)
    if not ok:
        return None, first_error(text)
    ranks = [json.load(open(os.path.join(tmp, f"gemm_{tile}.rank{r}.json")))
             for r in range(a.world)]
    worst = max(ranks, key=lambda r: r["median_ms"])
    return dict(median_ms=worst["median_ms"], gflops=min(r["gflops"] for r in ranks),
                tile=worst["tile"]), ""


def snapshot(tools, build, dir):
    """Copies the tools and the dloss libraries they load (the runtime, the JIT and
    the compiler library the JIT loads from beside itself) into `dir` (under the
    build lock when there is one), so that a rebuild in the shared tree cannot
    replace them halfway through a long run. Returns the copies' paths; with `dir`
    on LD_LIBRARY_PATH they load the copied libraries (RUNPATH yields to it)."""
    os.makedirs(dir, exist_ok=True)
    lock = "/tmp/dloss-build.lock"
    fd = os.open(lock, os.O_RDONLY) if os.path.exists(lock) else None
    try:
        if fd is not None:
            import fcntl
            print(f"snapshot: waiting for {lock}", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        copies = []
        for t in tools:
            copies.append(os.path.join(dir, os.path.basename(t)))
            shutil.copy2(t, copies[-1])
        for library in ("runtime/libdloss_runtime.so", "frontend/libdloss_jit.so",
                        "frontend/libdloss_compiler.so"):
            shutil.copy2(os.path.join(build, library), dir)
    finally:
        if fd is not None:
            os.close(fd)
    print(f"snapshot: the tools and dloss's libraries copied to {dir}", flush=True)
    return copies


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def size(mb):
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


# ---- the report ---------------------------------------------------------------

def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def family_rows(rows, families, variants):
    """One summary per family: fused vs unfused and the verdicts."""
    by = {(r["family"], r["variant"]): r for r in rows}
    out = []
    for fam in families:
        u, f = by.get((fam, "unfused")), by.get((fam, "fused"))
        s = dict(family=fam, status="ran", fused_ops=None, fused=None, unfused_ms=None,
                 fused_ms=None, time_ratio=None, unfused_mb=None, fused_mb=None, mem_ratio=None,
                 unfused_steady_mb=None, fused_steady_mb=None, steady_ratio=None,
                 target=None, note="", general="")
        if f and f["status"] == "missing":
            s.update(status="missing", note=f["note"])
            out.append(s)
            continue
        if f:
            s["fused_ops"], s["fused"] = f["fused_ops"], f["fused"]
        for key, r in (("unfused", u), ("fused", f)):
            if r and r["status"] == "ran":
                s[f"{key}_ms"], s[f"{key}_mb"] = r["median_ms"], r["loss_mem_mb"]
                steady = r.get("steady_mem_mb")
                s[f"{key}_steady_mb"] = steady if steady is not None and steady >= 0 else None
            elif r:
                s["note"] += f"{key} {r['status']}: {r['note']}; "
        if s["unfused_ms"] and s["fused_ms"] is not None:
            s["time_ratio"] = s["fused_ms"] / s["unfused_ms"]
        if s["unfused_mb"] and s["fused_mb"] is not None:
            s["mem_ratio"] = s["fused_mb"] / s["unfused_mb"]
        if s["unfused_steady_mb"] and s["fused_steady_mb"] is not None:
            s["steady_ratio"] = s["fused_steady_mb"] / s["unfused_steady_mb"]
        # The memory target is judged per step (steady state); without it, on
        # the first call's figure, which also holds the one-time setup.
        judged = s["steady_ratio"] if s["steady_ratio"] is not None else s["mem_ratio"]
        if s["time_ratio"] is not None and judged is not None:
            s["target"] = (s["time_ratio"] <= TARGET_TIME_RATIO
                           and judged <= TARGET_MEM_RATIO)
        if "general" in variants:
            g = by.get((fam, "general"))
            if g and g["status"] == "ran" and s["fused_ms"]:
                s["general"] = (f"general: {g['median_ms']:.1f} ms ({g['median_ms'] / s['fused_ms']:.2f}x "
                                f"fused), {g['loss_mem_mb']:.0f} MB, {', '.join(g['fused_ops'])}")
            elif g:
                s["note"] += f"general {g['status']}: {g['note']}; "
        out.append(s)
    return out


def markdown(summary, peak, a):
    yes = {True: "yes", False: "no", None: "-"}
    lines = ["| family | fused ops | unfused ms | fused ms | time fused/unfused "
             "| unfused MB per step | fused MB per step | mem per step fused/unfused "
             "| unfused MB first call | fused MB first call | mem first call fused/unfused "
             "| fused | target met |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for s in summary:
        if s["status"] == "missing":
            lines.append(f"| {s['family']} | (no examples/{s['family']}.mlir) "
                         "| | | | | | | | | | - | - |")
            continue
        ops = ", ".join(s["fused_ops"]) if s["fused_ops"] else "unfused"
        lines.append(
            f"| {s['family']} | {ops} | {fmt(s['unfused_ms'], '.1f')} | {fmt(s['fused_ms'], '.1f')} "
            f"| {fmt(s['time_ratio'], '.3f')} | {fmt(s['unfused_steady_mb'], '.0f')} "
            f"| {fmt(s['fused_steady_mb'], '.0f')} | {fmt(s['steady_ratio'], '.4f')} "
            f"| {fmt(s['unfused_mb'], '.0f')} "
            f"| {fmt(s['fused_mb'], '.0f')} | {fmt(s['mem_ratio'], '.4f')} "
            f"| {'yes' if s['fused'] else 'unfused' if s['fused'] is False else '-'} "
            f"| {yes[s['target']]} |")
    if peak:
        lines += ["", "| CLIP fused vs sgemm peak | 4 GEMMs ms | GFLOP/s per rank | fused CLIP ms "
                  "| fraction of peak |", "|---|---:|---:|---:|---:|"]
        for p in peak:
            lines.append(f"| plain at::mm, {p['shape']} | {fmt(p['median_ms'], '.1f')} "
                         f"| {fmt(p['gflops'], '.1f')} | {fmt(p['fused_ms'], '.1f')} "
                         f"| {fmt(p['fraction'], '.3f')} |")
    return "\n".join(lines)


def verdicts(summary, peak, want_peak=True):
    out = []
    for s in summary:
        if s["status"] == "missing":
            out.append(f"{s['family']}: NOT MEASURED ({s['note']})")
            continue
        if s["target"] is None:
            out.append(f"{s['family']}: NOT MEASURED ({s['note'].rstrip('; ') or 'no ratio'})")
            continue
        steady = ("memory per step n/a" if s["steady_ratio"] is None else
                  f"memory per step {s['fused_steady_mb']:.0f} / {s['unfused_steady_mb']:.0f} MB "
                  f"= {s['steady_ratio']:.4f}")
        out.append(f"{s['family']}: fused memory <= 1/20 and time <= {TARGET_TIME_RATIO}x "
                   f"unfused: {'MET' if s['target'] else 'NOT MET'} ({steady}; first call, with "
                   f"the one-time setup, {s['fused_mb']:.0f} / "
                   f"{s['unfused_mb']:.0f} MB = {s['mem_ratio']:.4f}; time {s['fused_ms']:.1f} / "
                   f"{s['unfused_ms']:.1f} ms = {s['time_ratio']:.3f}; "
                   f"{'fused: ' + ', '.join(s['fused_ops']) if s['fused'] else 'unfused'})")
    full = next((p for p in peak if p["shape"].startswith("full")), None)
    if full and full["fraction"] is not None:
        out.append(f"clip: fused step >= {TARGET_PEAK_FRACTION:.0%} of the sgemm peak: "
                   f"{'MET' if full['fraction'] >= TARGET_PEAK_FRACTION else 'NOT MET'} "
                   f"({full['median_ms']:.1f} ms of 4 plain GEMMs / {full['fused_ms']:.1f} ms "
                   f"fused = {full['fraction']:.3f})")
    elif want_peak and any(s["family"] == "clip" for s in summary):
        out.append("clip: fraction of the sgemm peak: NOT MEASURED"
                   + (f" ({full['note']})" if full and full["note"] else ""))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default=DEFAULT_EXAMPLES,
                   help="example losses (examples/NAME.mlir), comma-separated; a missing file "
                        "is reported, not an error")
    p.add_argument("--b-local", type=int, default=4096, help="rows per rank")
    p.add_argument("--dim", type=int, default=256, help="feature width d")
    p.add_argument("--world", type=int, default=4, help="local ranks")
    p.add_argument("--repeat", type=int, default=3,
                   help="timed forward+backward calls per run, after 1 warm-up call (median)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per rank (dloss-run --threads, OMP_NUM_THREADS)")
    p.add_argument("--variants", default="fused,unfused",
                   help="of fused, unfused, general (--general-fusion-only)")
    p.add_argument("--peak", default="full,auto",
                   help="the sgemm peak's GEMM shapes: full (the issue's: the whole n x M "
                        "GEMMs), auto (the CPU kernels' tile), RxC; empty: no peak")
    p.add_argument("--timeout", type=int, default=1800,
                   help="seconds a rank waits for a peer in one collective")
    p.add_argument("--force", action="store_true", help="ignore the memory skip rule")
    p.add_argument("--mem-available-mb", type=float, default=0,
                   help="RAM the ranks may use (default: MemAvailable of /proc/meminfo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir with bin/")
    p.add_argument("--dloss-run", default="", help="default BUILD/bin/dloss-run")
    p.add_argument("--dlossc", default="", help="default BUILD/bin/dlossc")
    p.add_argument("--gemm-peak", default="", help="default BUILD/bin/dloss-bench-gemm-peak")
    p.add_argument("--snapshot", action="store_true",
                   help="run copies of the tools (made under /tmp/dloss-build.lock), so that a "
                        "concurrent rebuild of the shared build tree cannot break a long run")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                   help="where families.csv goes")
    a = p.parse_args()

    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in ("fused", "unfused", "general"):
            p.error(f"--variants: unknown '{v}'")
    if "fused" not in variants:
        variants.insert(0, "fused")  # the rows are fused vs the others
    families = [e for e in a.examples.split(",") if e]
    dloss_run = a.dloss_run or os.path.join(a.build, "bin", "dloss-run")
    dlossc = a.dlossc or os.path.join(a.build, "bin", "dlossc")
    gemm_peak = a.gemm_peak or os.path.join(a.build, "bin", "dloss-bench-gemm-peak")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
               DLOSS_TIMEOUT_S=str(a.timeout))
    os.makedirs(a.out, exist_ok=True)
    snap = tempfile.TemporaryDirectory(prefix="dloss-bench-tools-") if a.snapshot else None
    if snap:
        dloss_run, dlossc, gemm_peak = snapshot([dloss_run, dlossc, gemm_peak], a.build, snap.name)
        env["LD_LIBRARY_PATH"] = snap.name + (":" + env["LD_LIBRARY_PATH"]
                                              if env.get("LD_LIBRARY_PATH") else "")
    a.dlossc = dlossc
    b_global = a.b_local * a.world
    matrix_mb = a.b_local * b_global * 4 / MB  # one fp32 B_local x B_global matrix

    rows, peak, failed = [], [], 0
    with tempfile.TemporaryDirectory(prefix="dloss-family-bench-") as tmp:
        for fam in families:
            example = os.path.join(ROOT, "examples", f"{fam}.mlir")
            base = dict(family=fam, world=a.world, b_local=a.b_local, b_global=b_global,
                        d=a.dim, repeat=a.repeat, threads=a.threads, status="ran",
                        median_ms=None, loss_mem_mb=None, steady_mem_mb=None,
                        peak_rss_mb=None, loss=None,
                        fused_ops=[], fused=None, note="")
            if not os.path.exists(example):
                print(f"- {fam}: examples/{fam}.mlir does not exist (yet): skipped", flush=True)
                rows.append(dict(base, variant="fused", status="missing",
                                 note=f"examples/{fam}.mlir does not exist"))
                continue
            try:
                inputs, how = make_inputs(fam, a.b_local, a.world, a.dim,
                                          os.path.join(tmp, f"inputs_{fam}"), a.seed)
            except (RuntimeError, ValueError) as e:
                failed += 1
                rows.append(dict(base, variant="fused", status="failed", note=str(e)))
                continue
            for v in variants:
                extra = {"fused": [], "unfused": ["--no-fuse"],
                         "general": ["--general-fusion-only"]}[v]
                row = dict(base, variant=v, note=how)
                rows.append(row)
                ops, why = fused_ops(dlossc, example, extra, env)
                if ops is None:
                    failed += 1
                    row.update(status="failed", note=f"dlossc: {why}")
                    continue
                row.update(fused_ops=ops, fused=bool(ops))
                k = PRIOR_K.get(fam, DEFAULT_K) if not ops else 0.0
                est = k * matrix_mb
                avail = a.mem_available_mb or mem_available_mb()
                if a.world * est > avail and not a.force:
                    row.update(status="skipped", note=(
                        f"skipped: {a.world} ranks x {size(est)} estimated (k={k:g}) > "
                        f"{size(avail)} available"))
                    print(f"- {fam} {v}: {row['note']}", flush=True)
                    continue
                r, why = bench_plan(a, dloss_run, example, extra, inputs,
                                    os.path.join(tmp, f"{fam}_{v}"), env)
                if r is None:
                    failed += 1
                    row.update(status="failed", note=why)
                    continue
                row.update(median_ms=r["median_ms"], loss_mem_mb=r["loss_mem_mb"],
                           steady_mem_mb=r["steady_mem_mb"], peak_rss_mb=r["peak_rss_mb"], loss=r["loss"])
                if not r["hwm_reset"]:
                    row["note"] += "; VmHWM could not be reset: loss_mem_mb may be an earlier peak"
                # The peak right after CLIP's fused step, under the same conditions.
                if fam == "clip" and v == "fused":
                    for shape in [s for s in a.peak.split(",") if s]:
                        pk, why = bench_peak(a, gemm_peak, shape, env, tmp)
                        if pk is None:
                            failed += 1
                            peak.append(dict(shape=shape, median_ms=None, gflops=None,
                                             fused_ms=r["median_ms"], fraction=None, note=why))
                            continue
                        label = "full shapes" if shape == "full" else f"tiles {pk['tile']}"
                        peak.append(dict(shape=label, median_ms=pk["median_ms"],
                                         gflops=pk["gflops"], fused_ms=r["median_ms"],
                                         fraction=pk["median_ms"] / r["median_ms"], note=""))

    if not any(r["status"] == "ran" for r in rows):
        print("run_family_bench.py: no plan ran", file=sys.stderr)
        failed += 1

    # Same inputs: the plans' losses must agree.
    for r in rows:
        if r["variant"] != "unfused" and r["status"] == "ran":
            u = next((x for x in rows if x["family"] == r["family"] and x["variant"] == "unfused"
                      and x["status"] == "ran"), None)
            if u and abs(r["loss"] - u["loss"]) > 1e-4 * max(abs(u["loss"]), 1e-30):
                r["note"] += f"; loss {r['loss']:.6g} differs from unfused {u['loss']:.6g}"
                print(f"WARNING: {r['family']} {r['variant']}: loss {r['loss']:.9g} vs unfused "
                      f"{u['loss']:.9g}", file=sys.stderr)

    cols = ["family", "variant", "world", "b_local", "b_global", "d", "repeat", "threads",
            "status", "median_ms", "loss_mem_mb", "steady_mem_mb", "peak_rss_mb", "loss",
            "fused_ops", "note"]
    path = os.path.join(a.out, "families.csv")
    with open(path, "w", newline="") as f:
        f.write(f"# Example losses fused vs unfused (--no-fuse), fp32, forward+backward, {a.world} "
                f"local Gloo ranks, {a.threads} intra-op thread(s) each; worst rank. MB = MiB.\n"
                f"# median_ms: median of {a.repeat} timed calls after 1 warm-up. loss_mem_mb: "
                "peak RSS after the calls minus RSS right before the first (the first call "
                "included: it also holds the process's one-time setup). steady_mem_mb: the "
                "later calls' peak RSS minus the RSS after the first call with the heap's "
                "free memory returned (malloc_trim): the memory of one step.\n")
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else " ".join(v)
                            if isinstance(v, list) else "" if v is None else v)
                        for k, v in r.items()})
        for pk in peak:
            w.writerow(dict(family="clip", variant=f"gemm-peak ({pk['shape']})", world=a.world,
                            b_local=a.b_local, b_global=b_global, d=a.dim, repeat=a.repeat,
                            threads=a.threads, status="ran" if pk["median_ms"] else "failed",
                            median_ms=fmt(pk["median_ms"], ".3f", ""),
                            note=pk["note"] or f"fraction of peak {pk['fraction']:.3f}"))

    summary = family_rows(rows, families, variants)
    print(f"\n{a.world} ranks, B_local {a.b_local}, B_global {b_global}, d {a.dim}, fp32, "
          f"{a.threads} intra-op thread(s) per rank, median of {a.repeat} timed steps:\n")
    print(markdown(summary, peak, a))
    notes = [f"- {s['family']}: " + "; ".join(x for x in (s["note"].rstrip("; "), s["general"]) if x)
             for s in summary if s["note"] or s["general"]]
    if notes:
        print("\n" + "\n".join(notes))
    print()
    for line in verdicts(summary, peak, want_peak=bool(a.peak)):
        print("verdict: " + line)
    print(f"\nwrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
