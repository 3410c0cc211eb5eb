"""OpenCLIP's own trainer with dloss's loss against OpenCLIP's loss, in one
run: step time and peak RSS per rank, as ratios (dloss / OpenCLIP).

Both runs are the real trainer (`python -m open_clip_train.main` and `python
-m dloss.open_clip_train`) under torchrun on CPU ranks, with the same
arguments: OpenCLIP's synthetic data, the tiny towers of the trainer test
(test/open_clip_train/fixture.py) and a per-rank batch where the loss
dominates the step (B_local 2048, 4 ranks: OpenCLIP's exact mode holds
B_local x B_global logits per direction, 64 MiB each in f32).

- step: rank 0's "Batch (t)" minus its "Data (t)" (the trainer's own log),
  the median over the steps after the first two (the first compiles
  dloss's plan);
- peak RSS: the largest resident set of any process of the run (each rank
  alike), read with getrusage(RUSAGE_CHILDREN) in a process that runs only
  that torchrun.

Run it in the CUDA torch's venv, on the CUDA build's dloss with the main
build's compiler (where torchvision and OpenCLIP's trainer install:
scripts/cuda-build.sh makes it):

    DLOSS_COMPILER_LIBRARY=build/frontend/libdloss_compiler.so \\
    PYTHONPATH=build-cuda/python .venv-cuda/bin/python \\
        bench/open_clip_train_bench.py [--ranks 4] [--batch 2048] [--steps 8]

Writes bench/results/open_clip_train.json (or --out) and prints a table.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER_TEST = os.path.join(os.path.dirname(HERE), "test", "open_clip_train")
sys.path.insert(0, TRAINER_TEST)

import fixture  # noqa: E402

# Runs one command and prints the largest RSS (KiB) of its process tree.
_PEAK = ("import resource, subprocess, sys\n"
         "code = subprocess.run(sys.argv[1:]).returncode\n"
         "print('PEAK_RSS_KIB', resource.getrusage("
         "resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.exit(code)\n")


def run(module, ranks, batch, steps, model, folder, name):
    """One training run: (rank 0's step times in s, its data times, the peak
    RSS in MiB, the wall time in s)."""
    args = ["--dataset-type", "synthetic", "--train-num-samples",
            str(ranks * batch * steps), "--model", model, "--batch-size",
            str(batch), "--epochs", "1", "--lr", "1e-3", "--warmup", "2",
            "--workers", "0", "--device", "cpu", "--precision", "fp32",
            "--seed", "0", "--save-frequency", "0", "--log-every-n-steps",
            "1", "--local-loss", "--gather-with-grad", "--name", name]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(ranks),
               os.path.join(TRAINER_TEST, "cpu_ddp.py"), module] + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The runs start in `folder` (OpenCLIP's ./logs): paths given relative
    # to here must still lead to dloss and its compiler.
    for name in ("PYTHONPATH", "DLOSS_COMPILER_LIBRARY", "DLOSS_CACHE_DIR"):
        if env.get(name):
            env[name] = os.pathsep.join(os.path.abspath(p) for p in
                                        env[name].split(os.pathsep) if p)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _PEAK] + command, cwd=folder,
                          env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit("%s failed:\n%s" % (module, output[-5000:]))
    timing = re.findall(r"Data \(t\): ([0-9.]+) Batch \(t\): ([0-9.]+)",
                        output)
    if len(timing) != steps:
        raise SystemExit("%s logged %d steps, expected %d:\n%s" % (
            module, len(timing), steps, output[-5000:]))
    data = [float(d) for d, _ in timing]
    step = [float(b) - float(d) for d, b in timing]
    peak = int(re.search(r"PEAK_RSS_KIB (\d+)", output).group(1)) / 1024
    return step, data, peak, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2048,
                        help="per-rank batch (B_local)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(
        HERE, "results", "open_clip_train.json"))
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3 (the first two are "
                     "warm-up)")
    folder = tempfile.mkdtemp(prefix="dloss-open-clip-train-bench-")
    model = fixture.write_model(os.path.join(folder, "tiny-vit"),
                                fixture.VIT)
    rows = {}
    for label, module in (("openclip", "open_clip_train.main"),
                          ("dloss", "dloss.open_clip_train")):
        step, data, peak, wall = run(module, args.ranks, args.batch,
                                     args.steps, model, folder, label)
        rows[label] = {"step_s": statistics.median(step[2:]),
                       "data_s": statistics.median(data[2:]),
                       "peak_rss_mib": peak, "wall_s": wall,
                       "steps_s": step}
    ratios = {"step": rows["dloss"]["step_s"] / rows["openclip"]["step_s"],
              "peak_rss": rows["dloss"]["peak_rss_mib"] /
              rows["openclip"]["peak_rss_mib"]}
    result = {"ranks": args.ranks, "batch_local": args.batch,
              "batch_global": args.ranks * args.batch, "steps": args.steps,
              "cpus": os.cpu_count(), "runs": rows, "ratios": ratios,
              "saved_mib": rows["openclip"]["peak_rss_mib"] -
              rows["dloss"]["peak_rss_mib"],
              "matrix_mib": args.batch * args.ranks * args.batch * 4 / 2**20}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("OpenCLIP's trainer, %d CPU ranks, B_local %d (B_global %d), "
          "%d steps (median of the last %d)" % (
              args.ranks, args.batch, args.ranks * args.batch, args.steps,
              args.steps - 2))
    print("%-9s %10s %10s %15s %8s" % ("loss", "step (s)", "data (s)",
                                       "peak RSS (MiB)", "wall (s)"))
    for label, row in rows.items():
        print("%-9s %10.3f %10.3f %15.0f %8.1f" % (
            label, row["step_s"], row["data_s"], row["peak_rss_mib"],
            row["wall_s"]))
    print("ratio dloss/OpenCLIP: step %.3f, peak RSS %.3f" % (
        ratios["step"], ratios["peak_rss"]))
    print("peak RSS saved per rank: %.0f MiB (one B_local x B_global float32 "
          "matrix: %.0f MiB)" % (result["saved_mib"], result["matrix_mib"]))


if __name__ == "__main__":
    main()
