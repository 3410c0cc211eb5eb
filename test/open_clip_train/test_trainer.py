"""OpenCLIP's own trainer, unchanged, with dloss's losses: `python -m
dloss.open_clip_train` against `python -m open_clip_train.main` (OpenCLIP
3.3.0, its own loss), each launched by torchrun on 2 CPU ranks (Gloo) over
OpenCLIP's csv pipeline on generated images (fixture.py), a tiny
`local-dir:` model, AdamW with eps 1 (Adam's default eps turns the
analytically zero gradient of attention's key bias into sign noise: runs
that agree to 1e-7 in gradient then differ by 1e-3 in parameters), 10
steps. The final checkpoints must agree within 1e-5 relative (L2 over all
parameters), for CLIP's exact mode, --accum-freq 2, SigLIP, a CoCa model and
one process; --torchcompile must run.

Runs in the CUDA torch's venv (.venv-cuda, on the CPU), where torchvision
and the trainer install (test/requirements-open-clip-train.txt), with the
CUDA build's dloss and the main build's compiler: scripts/cuda-build.sh
--check-only runs it."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

import fixture

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = 80  # 2 ranks x 4 images x 10 steps
COMMON = ["--dataset-type", "csv", "--epochs", "1", "--lr", "1e-3", "--eps",
          "1", "--warmup", "2", "--workers", "0", "--device", "cpu",
          "--precision", "fp32", "--seed", "0", "--save-frequency", "1",
          "--log-every-n-steps", "1", "--local-loss", "--gather-with-grad"]
TOLERANCE = 1e-5
MEASURED = {}


def _torchrun(ranks, module, args, cwd, timeout):
    """Runs `module` (as ``python -m``) on `ranks` CPU ranks under
    torchrun, through cpu_ddp.py (OpenCLIP's device_ids=[cpu] workaround),
    in `cwd` (OpenCLIP's default --logs is ./logs: torch 2.14's torchrun
    takes a --logs after the script as an ambiguous abbreviation of its own
    --logs-specs). Returns the output; raises on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with socket.socket() as s:  # the rendezvous port, free right now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run",
               "--nnodes", "1", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(port),
               os.path.join(HERE, "cpu_ddp.py"), module] + args
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError("%s on %d rank(s) failed (exit %d):\n%s" % (
            module, ranks, done.returncode, output[-6000:]))
    return output


def _parameters(path):
    """The checkpoint's parameters, without DDP's "module." prefix."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {re.sub(r"^module\.", "", k): v.double()
            for k, v in state["state_dict"].items()}


def _relative(mine, theirs):
    """||mine - theirs|| / ||theirs|| over every parameter."""
    assert mine.keys() == theirs.keys(), sorted(mine.keys() ^ theirs.keys())
    diff = sum(float((mine[k] - theirs[k]).pow(2).sum()) for k in theirs)
    norm = sum(float(theirs[k].pow(2).sum()) for k in theirs)
    return (diff / norm) ** 0.5


class OpenClipTrainer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dloss-open-clip-train-")
        cls.clip = fixture.write_model(os.path.join(cls.root, "tiny-vit"),
                                       fixture.VIT)
        cls.coca = fixture.write_model(os.path.join(cls.root, "tiny-coca"),
                                       fixture.COCA)
        cls.data = fixture.write_data(os.path.join(cls.root, "data"), IMAGES)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)
        for name, value in sorted(MEASURED.items()):
            print("METRIC open_clip_train %s relative_l2=%.3g" %
                  (name, value), file=sys.stderr)

    def train(self, name, module, ranks, extra, timeout=300):
        """The final parameters and the log of one training run."""
        args = ["--train-data", self.data, "--name", name,
                "--batch-size", str(8 // ranks)] + COMMON + extra
        output = _torchrun(ranks, module, args, self.root, timeout)
        checkpoint = os.path.join(self.root, "logs", name, "checkpoints",
                                  "epoch_1.pt")
        self.assertTrue(os.path.exists(checkpoint), output[-3000:])
        return _parameters(checkpoint), output

    def compare(self, name, ranks, extra, model=None):
        extra = ["--model", model or self.clip] + extra
        theirs, _ = self.train(name + "-openclip", "open_clip_train.main",
                               ranks, extra)
        mine, log = self.train(name + "-dloss", "dloss.open_clip_train",
                               ranks, extra)
        steps = re.findall(r"Train Epoch: 0 \[\s*(\d+)/%d" % IMAGES, log)
        self.assertEqual(len(steps), 10 // self.accum(extra), log[-3000:])
        MEASURED[name] = _relative(mine, theirs)
        self.assertLess(MEASURED[name], TOLERANCE, name)
        return log, theirs

    @staticmethod
    def accum(extra):
        return int(extra[extra.index("--accum-freq") + 1]) \
            if "--accum-freq" in extra else 1

    def test_clip_exact_mode(self):
        log, theirs = self.compare("clip", 2, [])
        # The comparison can fail: training moved the parameters 100 times
        # further than the tolerance (1.6e-3 measured; OpenCLIP's own
        # inexact default mode ends 4e-4 from its exact mode).
        start, _ = self.train("clip-start", "open_clip_train.main", 2,
                              ["--model", self.clip, "--lr", "0"])
        MEASURED["clip_moved"] = _relative(theirs, start)
        self.assertGreater(MEASURED["clip_moved"], 100 * TOLERANCE)
        # The one line at start, on rank 0 only.
        lines = [l for l in log.splitlines() if "dloss.open_clip_train:" in l]
        self.assertEqual(len(lines), 1, log[-3000:])
        self.assertIn("dloss.ClipLoss replaces open_clip.ClipLoss", lines[0])
        self.assertIn("Contrastive_loss is now the loss of the global batch",
                      lines[0])

    def test_accumulation(self):
        self.compare("accum", 2, ["--accum-freq", "2"])

    def test_siglip(self):
        log, _ = self.compare("siglip", 2, ["--siglip"])
        self.assertIn("dloss.SigLipLoss replaces open_clip.SigLipLoss", log)

    def test_coca(self):
        log, _ = self.compare("coca", 2, [], model=self.coca)
        self.assertIn("dloss.CoCaLoss replaces open_clip.CoCaLoss", log)
        self.assertIn("Caption_loss", log)

    def test_one_process(self):
        # No process group: OpenCLIP initialises none at world size 1.
        log, _ = self.compare("one-process", 1, [])
        self.assertIn("on 1 rank(s)", log)

    def test_torchcompile(self):
        _, log = self.train("compiled-dloss", "dloss.open_clip_train", 2,
                            ["--model", self.clip, "--torchcompile"],
                            timeout=600)
        self.assertIn("Compiling model", log)
        losses = re.findall(r"Contrastive_loss: ([0-9.]+)", log)
        self.assertEqual(len(losses), 10, log[-3000:])


class Refusals(unittest.TestCase):
    """What dloss.open_clip_train says instead of running."""

    def test_horovod(self):
        import argparse
        import dloss
        from dloss.open_clip_train import create_loss
        args = argparse.Namespace(horovod=True, distill=False, model="x",
                                  siglip=False)
        with self.assertRaises(dloss.Error) as caught:
            create_loss(args)
        self.assertIn("not Horovod", str(caught.exception))

    def test_a_create_loss_that_differs(self):
        import dloss
        from dloss import open_clip_train
        import open_clip_train.main as trainer
        original = trainer.create_loss

        def create_loss(args):  # a later version reading a new argument
            if args.new_loss:
                return None
            return original(args)

        trainer.create_loss = create_loss
        try:
            with self.assertRaises(dloss.Error) as caught:
                open_clip_train._trainer()
        finally:
            trainer.create_loss = original
        text = str(caught.exception)
        self.assertIn("differs from the tested 3.3.0", text)
        self.assertIn("also reads args.new_loss", text)
        self.assertIn("open_clip_torch 3.3.0's create_loss", text)
        self.assertIn('pip install "dloss[open-clip-train]"', text)
        self.assertIn('"open_clip_torch[training]==3.3.0"', text)


if __name__ == "__main__":
    unittest.main()
