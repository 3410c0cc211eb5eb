#!/usr/bin/python3
"""CLIP loss benchmark: eager LibTorch (OpenCLIP math) vs dloss, on N local Gloo ranks.

For each B_local, runs
  * eager:          dloss-bench-eager-clip --world N (OpenCLIP ClipLoss with
                    local_loss=True, gather_with_grad=True, ATen autograd over
                    the runtime's Gloo communicator), and
  * dloss-unfused:  dloss-run examples/clip.mlir --world N (the compiled plan,
                    today's unfused kernels),
both on features [B_local, d] fp32, and writes bench/results/clip.csv (plus
clip.png, memory vs global batch size, drawn without matplotlib).

usage: bench/run_clip_bench.py [--build build] [--b-local 1024,4096] [--large]
                               [--world 4] [--dim 256] [--iters 3] [--threads 1]
"""
import argparse
import csv
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if p.returncode != 0:
        sys.exit(f"run_clip_bench.py: failed ({p.returncode}):\n{p.stdout}")
    return p.stdout


def worst(ranks, key):
    """The slowest / largest rank: what the job waits for / must provision."""
    return max(r[key] for r in ranks)


def bench_eager(exe, b_local, a, env, tmp):
    out = os.path.join(tmp, f"eager_{b_local}.json")
    run([exe, "--world", str(a.world), "--b-local", str(b_local), "--dim", str(a.dim),
         "--iters", str(a.iters), "--warmup", "1", "--out", out], env)
    ranks = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(tmp, f"eager_{b_local}.rank*.json")))]
    assert len(ranks) == a.world, ranks
    return dict(median_ms=worst(ranks, "median_ms"), loss_mem_mb=worst(ranks, "loss_mem_mb"),
                peak_rss_mb=worst(ranks, "peak_rss_mb"), loss=ranks[0]["loss"])


def bench_dloss(dloss_run, dlossc, b_local, a, env, tmp):
    rng = np.random.default_rng(0)
    d = os.path.join(tmp, f"dloss_{b_local}")
    os.makedirs(d, exist_ok=True)
    inputs = []
    for name in ("image", "text"):
        for r in range(a.world):
            x = rng.standard_normal((b_local, a.dim)).astype(np.float32)
            np.save(os.path.join(d, f"{name}{r}.npy"), x / np.linalg.norm(x, axis=1, keepdims=True))
        inputs += ["--input", f"{name}={d}/{name}{{rank}}.npy"]
    inputs += ["--input", "scale=14.285714"]
    cmd = [dloss_run, os.path.join(ROOT, "examples", "clip.mlir"), "--world", str(a.world),
           "--iters", str(a.iters), "--out", os.path.join(d, "out")] + inputs
    if dlossc:
        cmd += ["--dlossc", dlossc]
    run(cmd, env)
    ranks = [json.load(open(os.path.join(d, "out", f"rank{r}", "result.json"))) for r in range(a.world)]
    return dict(median_ms=worst(ranks, "median_ms"), loss_mem_mb=None,
                peak_rss_mb=worst(ranks, "peak_rss_mb"), loss=ranks[0]["loss"])


# ---- a tiny PNG line plotter (no matplotlib on Debian's python3 here) -------

FONT = {  # 3x5 glyphs, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", "k": "100101110101101", "M": "101111111101101",
    "B": "110101110101110", ".": "000000000000010", " ": "000000000000000",
}


def write_png(path, series, xlabel_vals):
    W, H, L, R, T, Bm = 640, 420, 70, 20, 20, 50
    img = np.full((H, W, 3), 255, np.uint8)
    xs = [x for s in series for x, _ in s[2]]
    ys = [y for s in series for _, y in s[2]]
    lx0, lx1 = np.log2(min(xs)) - 0.3, np.log2(max(xs)) + 0.3
    y1 = max(ys) * 1.1 if ys else 1.0

    def px(x, y):
        return (int(L + (np.log2(x) - lx0) / (lx1 - lx0) * (W - L - R)),
                int(H - Bm - y / y1 * (H - T - Bm)))

    def dot(x, y, c, r=1):
        img[max(0, y - r):y + r + 1, max(0, x - r):x + r + 1] = c

    def line(p, q, c):
        n = max(abs(q[0] - p[0]), abs(q[1] - p[1]), 1)
        for t in np.linspace(0, 1, n + 1):
            dot(int(round(p[0] + t * (q[0] - p[0]))), int(round(p[1] + t * (q[1] - p[1]))), c, 1)

    def text(s, x, y, c=(0, 0, 0), scale=2):
        for ch in s:
            g = FONT.get(ch, FONT[" "])
            for i, bit in enumerate(g):
                if bit == "1":
                    yy, xx = y + (i // 3) * scale, x + (i % 3) * scale
                    img[yy:yy + scale, xx:xx + scale] = c
            x += 4 * scale

    line((L, T), (L, H - Bm), (0, 0, 0))
    line((L, H - Bm), (W - R, H - Bm), (0, 0, 0))
    for v in xlabel_vals:  # x ticks: global batch size
        x, _ = px(v, 0)
        line((x, H - Bm), (x, H - Bm + 5), (0, 0, 0))
        lab = f"{v // 1024}k" if v % 1024 == 0 else str(v)
        text(lab, x - len(lab) * 4, H - Bm + 10)
    for k in range(5):  # y ticks: MB
        v = y1 * k / 4
        _, y = px(xs[0], v)
        line((L - 5, y), (L, y), (0, 0, 0))
        lab = f"{v:.0f}"
        text(lab, L - 8 - len(lab) * 8, y - 5)
    text("MB", 8, T)
    text("B", W - R - 10, H - 18)
    for i, (name, color, pts) in enumerate(series):
        pts = sorted(pts)
        for p, q in zip(pts, pts[1:]):
            line(px(*p), px(*q), color)
        for p in pts:
            dot(*px(*p), color, 4)
        img[T + 8 + 16 * i:T + 18 + 16 * i, L + 20:L + 40] = color  # legend swatch
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(H))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir with bin/")
    p.add_argument("--eager", default="", help="dloss-bench-eager-clip (default BUILD/bin/...)")
    p.add_argument("--dloss-run", default="", help="dloss-run (default BUILD/bin/dloss-run)")
    p.add_argument("--dlossc", default="", help="passed to dloss-run --dlossc")
    p.add_argument("--b-local", default="1024,4096")
    p.add_argument("--large", action="store_true", help="also B_local=16384 (eager needs > 8 GiB/rank)")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = p.parse_args()

    eager = a.eager or os.path.join(a.build, "bin", "dloss-bench-eager-clip")
    dloss_run = a.dloss_run or os.path.join(a.build, "bin", "dloss-run")
    sizes = [int(s) for s in a.b_local.split(",") if s]
    if a.large and 16384 not in sizes:
        sizes.append(16384)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    os.makedirs(a.out, exist_ok=True)

    rows = []
    with tempfile.TemporaryDirectory(prefix="dloss-bench-") as tmp:
        for b in sizes:
            e = bench_eager(eager, b, a, env, tmp)
            u = bench_dloss(dloss_run, a.dlossc, b, a, env, tmp)
            for impl, r in (("eager", e), ("dloss-unfused", u)):
                rows.append(dict(impl=impl, world=a.world, b_local=b, b_global=b * a.world, d=a.dim,
                                 iters=a.iters, median_ms=r["median_ms"], loss_mem_mb=r["loss_mem_mb"],
                                 peak_rss_mb=r["peak_rss_mb"],
                                 time_vs_eager=r["median_ms"] / e["median_ms"],
                                 peak_rss_vs_eager=r["peak_rss_mb"] / e["peak_rss_mb"]))

    cols = ["impl", "world", "b_local", "b_global", "d", "iters", "median_ms", "loss_mem_mb",
            "peak_rss_mb", "time_vs_eager", "peak_rss_vs_eager"]
    path = os.path.join(a.out, "clip.csv")
    with open(path, "w", newline="") as f:
        f.write("# CLIP loss (OpenCLIP local_loss + gather_with_grad), fp32, forward+backward, "
                f"{a.world} local Gloo ranks, OMP_NUM_THREADS={a.threads}; worst rank of each run.\n"
                "# median_ms: median of ITERS timed calls after 1 warm-up. loss_mem_mb: peak RSS "
                "(VmHWM) minus RSS right before the first call (eager only; dloss-run does not "
                "report a baseline: empty).\n# peak_rss_mb: total peak RSS of the rank (getrusage "
                "ru_maxrss): dloss-run's since exec; eager's since /proc/self/clear_refs reset it "
                "right before the first call (includes the ~75 MB baseline).\n")
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else ("" if v is None else v))
                        for k, v in r.items()})

    print(f"\n{'impl':<15}{'B_local':>8}{'B_global':>9}{'ms':>10}{'loss MB':>9}{'peak MB':>9}"
          f"{'t/eager':>9}{'rss/eager':>10}")
    for r in rows:
        lm = "-" if r["loss_mem_mb"] is None else f"{r['loss_mem_mb']:.0f}"
        print(f"{r['impl']:<15}{r['b_local']:>8}{r['b_global']:>9}{r['median_ms']:>10.1f}{lm:>9}"
              f"{r['peak_rss_mb']:>9.0f}{r['time_vs_eager']:>9.2f}{r['peak_rss_vs_eager']:>10.2f}")
    print(f"\nwrote {path}")

    series = [
        ("eager peak RSS", (200, 40, 40), [(r["b_global"], r["peak_rss_mb"]) for r in rows if r["impl"] == "eager"]),
        ("eager loss mem", (240, 160, 40), [(r["b_global"], r["loss_mem_mb"]) for r in rows if r["impl"] == "eager"]),
        ("dloss-unfused peak RSS", (40, 80, 200), [(r["b_global"], r["peak_rss_mb"]) for r in rows if r["impl"] == "dloss-unfused"]),
    ]
    png = os.path.join(a.out, "clip.png")
    write_png(png, series, sorted({r["b_global"] for r in rows}))
    print(f"wrote {png} (memory per rank vs global batch; red: eager peak RSS, orange: eager "
          "loss memory, blue: dloss-unfused peak RSS)")


if __name__ == "__main__":
    main()
