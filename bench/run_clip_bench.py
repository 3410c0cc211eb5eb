#!/usr/bin/env python3
"""CLIP loss benchmark: eager LibTorch (OpenCLIP math) vs dloss unfused vs dloss fused.

On N local Gloo ranks (processes on loopback), features [B_local, d] fp32, for
each B_local it runs
  * eager:          dloss-bench-eager-clip --world N (OpenCLIP ClipLoss with
                    local_loss=True, gather_with_grad=True in ATen autograd over
                    the runtime's Gloo communicator),
  * dloss-unfused:  dloss-run examples/clip.mlir --world N --no-fuse (the plan
                    materialises the B_local x B_global matrices),
  * dloss-fused:    dloss-run examples/clip.mlir --world N (default: ring-tiled
                    kernels that never build them),
and reports the time of one forward+backward and the loss's memory per rank
(peak RSS minus the RSS right before the first call), each as a ratio against
the eager row of the same B_local. Writes OUT/clip.csv and OUT/clip.png
(loss memory per rank against the global batch size).

Skip rule: an implementation whose estimated memory for N ranks exceeds the
available RAM (MemAvailable of /proc/meminfo) is not run at that size (a row
says why, with the estimate); --force runs it anyway. The estimate per rank is
k * B_local * B_global * 4 bytes, k being the slope of the loss memory against
B_local * B_global * 4 bytes between the two largest sizes this run measured
for that implementation, or, with fewer than two, the prior k of --prior-k.

usage: bench/run_clip_bench.py [--b-local 1024,4096,16384]
                               [--impls eager,unfused,fused] [--iters 3] ...
"""
import argparse
import csv
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1024 * 1024  # the tools' "MB" are MiB (kB / 1024)

IMPLS = {"eager": "eager", "unfused": "dloss-unfused", "fused": "dloss-fused"}
COLORS = {"eager": (200, 40, 40), "dloss-unfused": (40, 80, 200), "dloss-fused": (30, 150, 60)}
# Prior k (loss memory / (B_local * B_global * 4 bytes)) before this run has
# two sizes to fit: eager ~8.7 and unfused ~6.8 were measured at B_local = 4096
# on 4 ranks (logits, their softmax and gradients); fused holds no such matrix.
PRIOR_K = "eager=9,unfused=7,fused=0"

# The issue's targets, against the eager row of the same run.
TARGET_B = 4096
TARGET_MEM_RATIO = 1 / 8
TARGET_TIME_RATIO = 0.85
LARGE_B = 16384
LARGE_FUSED_MB = 512


def run(cmd, env):
    """Runs a benchmark process; returns (ok, output)."""
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout, end="", file=sys.stderr)
        print(f"run_clip_bench.py: the command above failed ({p.returncode})", file=sys.stderr)
    return p.returncode == 0, p.stdout


def worst(ranks, key):
    """The slowest / largest rank: what the job waits for / must fit."""
    return max(r[key] for r in ranks)


def summarise(ranks):
    return dict(median_ms=worst(ranks, "median_ms"), loss_mem_mb=worst(ranks, "loss_mem_mb"),
                peak_rss_mb=worst(ranks, "peak_rss_mb"), loss=ranks[0]["loss"],
                hwm_reset=all(r.get("hwm_reset", False) for r in ranks))


def bench_eager(exe, b_local, a, env, tmp):
    out = os.path.join(tmp, f"eager_{b_local}.json")
    ok, text = run([exe, "--world", str(a.world), "--b-local", str(b_local), "--dim", str(a.dim),
                    "--iters", str(a.iters), "--warmup", "1", "--out", out], env)
    if not ok:
        return None, text
    ranks = [json.load(open(os.path.join(tmp, f"eager_{b_local}.rank{r}.json")))
             for r in range(a.world)]
    return summarise(ranks), text


def make_inputs(b_local, a, tmp):
    """Per-rank L2-normalised features, shared by the unfused and fused rows."""
    rng = np.random.default_rng(0)
    d = os.path.join(tmp, f"inputs_{b_local}")
    os.makedirs(d, exist_ok=True)
    args = []
    for name in ("image", "text"):
        for r in range(a.world):
            x = rng.standard_normal((b_local, a.dim), dtype=np.float32)
            np.save(os.path.join(d, f"{name}{r}.npy"), x / np.linalg.norm(x, axis=1, keepdims=True))
        args += ["--input", f"{name}={d}/{name}{{rank}}.npy"]
    return args + ["--input", "scale=14.285714"]


def bench_dloss(dloss_run, fuse, b_local, inputs, a, env, tmp):
    out = os.path.join(tmp, f"{'fused' if fuse else 'unfused'}_{b_local}")
    cmd = [dloss_run, os.path.join(ROOT, "examples", "clip.mlir"), "--world", str(a.world),
           "--iters", str(a.iters), "--timeout", str(a.timeout), "--out", out] + inputs
    if not fuse:
        cmd.append("--no-fuse")
    ok, text = run(cmd, env)
    if not ok:
        return None, text
    ranks = [json.load(open(os.path.join(out, f"rank{r}", "result.json"))) for r in range(a.world)]
    return summarise(ranks), text


def matrix_bytes(b_local, world):
    """One B_local x B_global fp32 matrix."""
    return b_local * b_local * world * 4


def estimate_mb(impl, b_local, a, measured, prior_k):
    """Estimated loss memory per rank (MiB) and how it was estimated."""
    pts = sorted(measured.get(impl, []))
    if len(pts) >= 2:
        (x0, y0, b0), (x1, y1, b1) = pts[-2], pts[-1]
        k = max(0.0, (y1 - y0) * MB / (x1 - x0))
        how = (f"k={k:.2f}: slope of loss memory vs B_local*B_global*4 B between B_local="
               f"{b0} and {b1} in this run")
    else:
        k = prior_k[impl]
        how = f"k={k:g}: prior (--prior-k), fewer than 2 sizes measured"
    return k * matrix_bytes(b_local, a.world) / MB, how


def size(mb):
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


# ---- a tiny PNG plotter (no matplotlib on Debian's python3 here) -----------

FONT = {  # 3x5 glyphs, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", "M": "101111111101101", "B": "110101110101110",
    "G": "011100101101011", "a": "000011101101011", "b": "100110101101110",
    "c": "000011100100011", "d": "001011101101011", "e": "000010111100011",
    "f": "011100110100100", "g": "000011101011110", "h": "100110101101101",
    "i": "010000010010010", "k": "100101110101101", "l": "110010010010111",
    "m": "000110111101101", "n": "000110101101101", "o": "000010101101010",
    "p": "000110101110100", "r": "000011100100100", "s": "000011110011110",
    "t": "010111010010011", "u": "000101101101011", "x": "000101010101101",
    "y": "000101101011110", "z": "000111001010111",
    "-": "000000111000000", ".": "000000000000010",
    "(": "010100100100010", ")": "010001001001010", "/": "001001010100100",
    ":": "000010000010000", ",": "000000000010100", " ": "000000000000000",
}


def write_png(path, series, x_ticks):
    """series: (name, color, measured [(x, y)], estimated [(x, y)]); log-log axes."""
    W, H, L, R, T, Bm = 720, 460, 80, 20, 20, 60
    img = np.full((H, W, 3), 255, np.uint8)
    xs = [x for s in series for x, _ in s[2] + s[3]]
    ys = [y for s in series for _, y in s[2] + s[3] if y > 0]
    if not xs or not ys:
        return False
    lx0, lx1 = np.log2(min(xs)) - 0.3, np.log2(max(xs)) + 0.3
    ly0, ly1 = np.log10(min(ys)) - 0.2, np.log10(max(ys)) + 0.2

    def px(x, y):
        return (int(L + (np.log2(x) - lx0) / (lx1 - lx0) * (W - L - R)),
                int(H - Bm - (np.log10(max(y, 1e-9)) - ly0) / (ly1 - ly0) * (H - T - Bm)))

    def dot(x, y, c, r=1):
        img[max(0, y - r):max(0, y + r + 1), max(0, x - r):max(0, x + r + 1)] = c

    def line(p, q, c, dashed=False):
        n = max(abs(q[0] - p[0]), abs(q[1] - p[1]), 1)
        for i, t in enumerate(np.linspace(0, 1, n + 1)):
            if not dashed or (i // 6) % 2 == 0:
                dot(int(round(p[0] + t * (q[0] - p[0]))), int(round(p[1] + t * (q[1] - p[1]))), c, 1)

    def box(x, y, c, r=5):  # hollow marker: an estimate, not a measurement
        img[y - r:y + r + 1, x - r:x - r + 2] = c
        img[y - r:y + r + 1, x + r - 1:x + r + 1] = c
        img[y - r:y - r + 2, x - r:x + r + 1] = c
        img[y + r - 1:y + r + 1, x - r:x + r + 1] = c

    def text(s, x, y, c=(0, 0, 0), scale=2):
        for ch in s:
            for i, bit in enumerate(FONT.get(ch, FONT[" "])):
                if bit == "1":
                    yy, xx = y + (i // 3) * scale, x + (i % 3) * scale
                    img[yy:yy + scale, xx:xx + scale] = c
            x += 4 * scale

    line((L, T), (L, H - Bm), (0, 0, 0))
    line((L, H - Bm), (W - R, H - Bm), (0, 0, 0))
    for v in x_ticks:  # global batch size
        x, _ = px(v, 1)
        line((x, H - Bm), (x, H - Bm + 5), (0, 0, 0))
        lab = f"{v // 1024}k" if v % 1024 == 0 else str(v)
        text(lab, x - len(lab) * 4, H - Bm + 10)
    text("global batch size", (L + W - R) // 2 - 68, H - 22)
    y_ticks = [m * 10 ** e for e in range(-1, 7) for m in (1, 2, 5)
               if ly0 <= np.log10(m * 10 ** e) <= ly1]
    if len(y_ticks) > 9:
        y_ticks = [v for v in y_ticks if str(v).lstrip("0.").startswith("1")]
    for v in y_ticks:  # MiB per rank
        _, y = px(xs[0], v)
        line((L - 5, y), (L, y), (0, 0, 0))
        lab = f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"
        text(lab, L - 8 - len(lab) * 8, y - 5)
    text("MB per rank", 4, 4)
    for i, (name, color, measured, estimated) in enumerate(series):
        measured, estimated = sorted(measured), sorted(estimated)
        for p, q in zip(measured, measured[1:]):
            line(px(*p), px(*q), color)
        if measured and estimated:
            line(px(*measured[-1]), px(*estimated[0]), color, dashed=True)
        for p in measured:
            dot(*px(*p), color, 4)
        for p in estimated:
            box(*px(*p), color)
        # Legend, top left inside the axes.
        y = T + 8 + 16 * i
        img[y:y + 10, L + 15:L + 35] = color
        text(name, L + 42, y)
    y = T + 8 + 16 * len(series)
    box(L + 25, y + 5, (0, 0, 0))
    text("estimate (skipped)", L + 42, y)
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(H))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    return True


# ---- the report -------------------------------------------------------------

def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def verdicts(rows, a):
    """One line per target of the issue: met / not met, with the numbers."""
    by = {(r["impl"], r["b_local"]): r for r in rows}
    out = []

    def measured(impl, b):
        r = by.get((impl, b))
        return r if r and r["status"] == "ran" else None

    e, f = measured("eager", TARGET_B), measured("dloss-fused", TARGET_B)
    if e and f:
        ratio = f["loss_mem_mb"] / e["loss_mem_mb"]
        out.append(f"B_local={TARGET_B}: fused loss memory <= 1/8 of eager's: "
                   f"{'MET' if ratio <= TARGET_MEM_RATIO else 'NOT MET'} "
                   f"({f['loss_mem_mb']:.0f} / {e['loss_mem_mb']:.0f} MB = {ratio:.3f}, target "
                   f"<= {TARGET_MEM_RATIO:.3f})")
        ratio = f["median_ms"] / e["median_ms"]
        out.append(f"B_local={TARGET_B}: fused time <= {TARGET_TIME_RATIO}x eager's: "
                   f"{'MET' if ratio <= TARGET_TIME_RATIO else 'NOT MET'} "
                   f"({f['median_ms']:.1f} / {e['median_ms']:.1f} ms = {ratio:.3f})")
    else:
        out.append(f"B_local={TARGET_B} targets (memory <= 1/8, time <= {TARGET_TIME_RATIO}x "
                   "eager): NOT MEASURED (needs the eager and fused rows at that size)")
    f = measured("dloss-fused", LARGE_B)
    if f:
        out.append(f"B_local={LARGE_B}: fused loss memory < {LARGE_FUSED_MB} MB: "
                   f"{'MET' if f['loss_mem_mb'] < LARGE_FUSED_MB else 'NOT MET'} "
                   f"({f['loss_mem_mb']:.0f} MB)")
    else:
        out.append(f"B_local={LARGE_B}: fused loss memory < {LARGE_FUSED_MB} MB: NOT MEASURED")
    e = by.get(("eager", LARGE_B))
    if e and e["status"] != "ran" and e["est_loss_mem_mb"] is not None:
        out.append(f"B_local={LARGE_B}: eager not run: estimated {size(e['est_loss_mem_mb'])} "
                   f"per rank, {size(a.world * e['est_loss_mem_mb'])} for {a.world} ranks "
                   f"({e['note']})")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir with bin/")
    p.add_argument("--eager", default="", help="dloss-bench-eager-clip (default BUILD/bin/...)")
    p.add_argument("--dloss-run", default="", help="dloss-run (default BUILD/bin/dloss-run)")
    p.add_argument("--b-local", default="1024,4096,16384", help="rows per rank, comma-separated")
    p.add_argument("--impls", default="eager,unfused,fused",
                   help="which rows to run, of eager, unfused, fused")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--iters", type=int, default=3, help="timed calls, after 1 warm-up call")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    p.add_argument("--timeout", type=int, default=1800,
                   help="seconds a rank waits for a peer in one collective (DLOSS_TIMEOUT_S)")
    p.add_argument("--force", action="store_true",
                   help="run every implementation at every size, even past the memory estimate")
    p.add_argument("--prior-k", default=PRIOR_K,
                   help="k per implementation before two sizes are measured (see the skip rule)")
    p.add_argument("--mem-available-mb", type=float, default=0,
                   help="RAM the ranks may use (default: MemAvailable of /proc/meminfo)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run or be skipped (with the prior k), run nothing")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = p.parse_args()

    impls = []
    for name in a.impls.split(","):
        if name not in IMPLS:
            p.error(f"--impls: unknown '{name}' (choose from {', '.join(IMPLS)})")
        impls.append(name)
    prior_k = {IMPLS[k]: float(v) for k, v in (kv.split("=") for kv in a.prior_k.split(","))}
    eager = a.eager or os.path.join(a.build, "bin", "dloss-bench-eager-clip")
    dloss_run = a.dloss_run or os.path.join(a.build, "bin", "dloss-run")
    sizes = sorted({int(s) for s in a.b_local.split(",") if s})
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
               DLOSS_TIMEOUT_S=str(a.timeout))
    os.makedirs(a.out, exist_ok=True)

    rows, failed = [], 0
    measured = {}  # impl -> [(matrix bytes, loss memory MiB, b_local)]
    with tempfile.TemporaryDirectory(prefix="dloss-bench-") as tmp:
        for b in sizes:
            inputs = None
            for key in impls:
                impl = IMPLS[key]
                est, how = estimate_mb(impl, b, a, measured, prior_k)
                avail = a.mem_available_mb or mem_available_mb()
                row = dict(impl=impl, world=a.world, b_local=b, b_global=b * a.world, d=a.dim,
                           iters=a.iters, status="ran", median_ms=None, loss_mem_mb=None,
                           peak_rss_mb=None, est_loss_mem_mb=est, time_vs_eager=None,
                           loss_mem_vs_eager=None, loss=None, note=how)
                rows.append(row)
                if a.world * est > avail and not a.force:
                    row["status"] = "skipped"
                    row["note"] = (f"skipped: {a.world} ranks x {size(est)} estimated > "
                                   f"{size(avail)} available; estimate {how}")
                    print(f"- {impl} B_local={b}: {row['note']}", flush=True)
                    continue
                if a.dry_run:
                    row["status"] = "dry-run"
                    print(f"- {impl} B_local={b}: would run (estimated {est:.0f} MB per rank, "
                          f"{how})", flush=True)
                    continue
                if key == "eager":
                    r, text = bench_eager(eager, b, a, env, tmp)
                else:
                    inputs = inputs or make_inputs(b, a, tmp)
                    r, text = bench_dloss(dloss_run, key == "fused", b, inputs, a, env, tmp)
                if r is None:
                    failed += 1
                    row["status"] = "failed"
                    lines = [l for l in text.splitlines() if l.strip()]
                    why = [l for l in lines if "error" in l.lower()] or lines[-1:] or ["no output"]
                    row["note"] = "failed: " + why[0]
                    continue
                row.update(median_ms=r["median_ms"], loss_mem_mb=r["loss_mem_mb"],
                           peak_rss_mb=r["peak_rss_mb"], loss=r["loss"])
                if not r["hwm_reset"]:
                    row["note"] += "; VmHWM could not be reset: loss_mem_mb may be an earlier peak"
                measured.setdefault(impl, []).append((matrix_bytes(b, a.world), r["loss_mem_mb"], b))

    # Ratios against the eager row of the same B_local, and the two dloss
    # plans' losses (same inputs) against each other.
    for r in rows:
        e = next((x for x in rows if x["impl"] == "eager" and x["b_local"] == r["b_local"]
                  and x["status"] == "ran"), None)
        if e and r["status"] == "ran":
            r["time_vs_eager"] = r["median_ms"] / e["median_ms"]
            r["loss_mem_vs_eager"] = r["loss_mem_mb"] / e["loss_mem_mb"]
        if r["impl"] == "dloss-fused" and r["status"] == "ran":
            u = next((x for x in rows if x["impl"] == "dloss-unfused"
                      and x["b_local"] == r["b_local"] and x["status"] == "ran"), None)
            if u and abs(r["loss"] - u["loss"]) > 1e-4 * abs(u["loss"]):
                r["note"] += f"; loss {r['loss']:.6g} differs from unfused {u['loss']:.6g}"
                print(f"WARNING: B_local={r['b_local']}: fused loss {r['loss']:.9g} vs unfused "
                      f"{u['loss']:.9g}", file=sys.stderr)

    cols = ["impl", "world", "b_local", "b_global", "d", "iters", "status", "median_ms",
            "loss_mem_mb", "peak_rss_mb", "est_loss_mem_mb", "time_vs_eager",
            "loss_mem_vs_eager", "note"]
    path = os.path.join(a.out, "clip.csv")
    if not a.dry_run:
        with open(path, "w", newline="") as f:
            f.write("# CLIP loss (OpenCLIP local_loss + gather_with_grad), fp32, forward+backward, "
                    f"{a.world} local Gloo ranks, OMP_NUM_THREADS={a.threads}; worst rank of each "
                    "run. MB = MiB.\n# median_ms: median of ITERS timed calls after 1 warm-up. "
                    "loss_mem_mb: peak RSS (VmHWM) after the calls minus VmRSS right before the "
                    "first call (VmHWM reset there). peak_rss_mb: the rank's total peak RSS.\n"
                    "# est_loss_mem_mb: k * B_local * B_global * 4 B, the estimate the skip rule "
                    "used (note says which k). *_vs_eager: over the eager row of the same B_local.\n")
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else ("" if v is None else v))
                            for k, v in r.items()})

    print(f"\n{'impl':<15}{'B_local':>8}{'B_global':>9}{'status':>9}{'ms':>10}{'loss MB':>9}"
          f"{'peak MB':>9}{'est MB':>9}{'t/eager':>9}{'mem/eager':>10}")
    for r in rows:
        print(f"{r['impl']:<15}{r['b_local']:>8}{r['b_global']:>9}{r['status']:>9}"
              f"{fmt(r['median_ms'], '.1f'):>10}{fmt(r['loss_mem_mb'], '.0f'):>9}"
              f"{fmt(r['peak_rss_mb'], '.0f'):>9}{fmt(r['est_loss_mem_mb'], '.0f'):>9}"
              f"{fmt(r['time_vs_eager'], '.2f'):>9}{fmt(r['loss_mem_vs_eager'], '.3f'):>10}")
    for r in rows:
        if r["status"] in ("skipped", "failed"):
            print(f"  {r['impl']} B_local={r['b_local']}: {r['note']}")
    print()
    for line in verdicts(rows, a):
        print("verdict: " + line)
    if a.dry_run:
        return 0

    series = []
    for impl in IMPLS.values():
        mine = [r for r in rows if r["impl"] == impl]
        if any(r["status"] in ("ran", "skipped") for r in mine):
            series.append((impl, COLORS[impl],
                           [(r["b_global"], r["loss_mem_mb"]) for r in mine if r["status"] == "ran"],
                           [(r["b_global"], r["est_loss_mem_mb"]) for r in mine
                            if r["status"] == "skipped" and r["est_loss_mem_mb"] > 0]))
    png = os.path.join(a.out, "clip.png")
    print(f"\nwrote {path}")
    if write_png(png, series, sorted({r["b_global"] for r in rows})):
        print(f"wrote {png} (loss memory per rank vs global batch size, log-log; red: eager, "
              "blue: dloss-unfused, green: dloss-fused; hollow squares: skipped, estimated)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
