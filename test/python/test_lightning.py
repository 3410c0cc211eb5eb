"""dloss.lightning on 2 Gloo ranks with the real Lightning: GradSyncCheck in
a Trainer(strategy="ddp") passes a correct module and raises on every rank
for a manual-optimization step whose loss.backward() bypasses DDP, naming the
student's parameters; check_grads_synced in a Fabric DDP loop raises on every
rank for a submodule called directly (model.student(x)), naming its
parameters, the submodule and this file's line of the call (from the first
step after watch(), from the second without), names a gradient edited on one
rank without blaming a direct call, and passes the corrected loop, a step
that also calls the wrapped model, and a no_backward_sync step. GradSyncCheck
also checks only every n-th step, and does nothing in a one-process Trainer;
`import dloss` never imports Lightning."""

import subprocess
import sys
import unittest

import torch

import multiproc

WORLD = 2




class Distill(torch.nn.Module):
    """A frozen teacher and a trainable student; forward() runs the
    student."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.teacher = torch.nn.Linear(6, 4)
        self.teacher.requires_grad_(False)
        self.student = torch.nn.Sequential(torch.nn.Linear(6, 5),
                                           torch.nn.Tanh(),
                                           torch.nn.Linear(5, 4))

    def forward(self, x):
        return self.student(x)


def _data(rank):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))


def _trainer_runs():
    import lightning.pytorch as pl

    import dloss.lightning

    class Module(pl.LightningModule):
        def __init__(self, manual=None):
            super().__init__()
            self.net = Distill()
            self.manual = manual
            self.automatic_optimization = manual is None

        def training_step(self, batch, batch_idx):
            (x,) = batch
            loss = (self.net.student(x) - self.net.teacher(x)).pow(2).mean()
            if self.manual is None:
                return loss
            opt = self.optimizers()
            opt.zero_grad()
            if self.manual == "lightning" or (
                    self.manual == "bypass_odd" and not self.global_step % 2):
                self.manual_backward(loss)
            else:
                loss.backward()  # bypasses DDP's all-reduce
            opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(16, 6, generator=torch.Generator().manual_seed(1))),
        batch_size=2)

    def fit(manual, every_n_steps=1):
        trainer = pl.Trainer(
            strategy="ddp", accelerator="cpu", devices=WORLD, max_steps=3,
            logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[dloss.lightning.GradSyncCheck(every_n_steps)])
        trainer.fit(Module(manual), data)
        return trainer.global_step

    out = {"automatic": multiproc.outcome(lambda: fit(None)),
           "manual_backward": multiproc.outcome(lambda: fit("lightning")),
           "loss_backward": multiproc.outcome(lambda: fit("bypass")),
           # loss.backward() on step 1 only: seen by a check of every step,
           # and by none of a check of every other step.
           "odd_every_1": multiproc.outcome(lambda: fit("bypass_odd")),
           "odd_every_2": multiproc.outcome(lambda: fit("bypass_odd", 2))}
    return out


def _fabric_runs(rank):
    from lightning.fabric import Fabric

    import dloss.lightning

    fabric = Fabric(strategy="ddp", accelerator="cpu", devices=WORLD)
    fabric.launch()
    x = _data(rank)

    def setup():
        return fabric.setup(Distill())

    def step(model, direct):
        model.zero_grad()
        if direct:
            out = model.student(x)  # direct call
        else:
            out = model(x)
        fabric.backward((out - model.teacher(x)).pow(2).mean())

    out = {}
    model = setup()
    dloss.lightning.watch(model)
    step(model, True)
    out["direct_watched"] = multiproc.outcome(
        lambda: dloss.lightning.check_grads_synced(model))

    model = setup()
    out["direct_steps"] = []
    for _ in range(2):
        step(model, True)
        out["direct_steps"].append(multiproc.outcome(
            lambda: dloss.lightning.check_grads_synced(model)))

    model = setup()
    dloss.lightning.watch(model)
    out["wrapped"] = []
    for _ in range(2):
        step(model, False)
        out["wrapped"].append(multiproc.outcome(
            lambda: dloss.lightning.check_grads_synced(model)))

    # The wrapped model and a direct call in one step: DDP reduces every
    # gradient, so the recorded direct call is never reported.
    model.zero_grad()
    loss = model(x).sum() + model.student(x).sum()
    fabric.backward(loss)
    out["mixed"] = multiproc.outcome(lambda: dloss.lightning.check_grads_synced(model))

    # A gradient edited on one rank after a wrapped forward: differing, but
    # no submodule was called directly.
    step(model, False)
    if rank == 1:
        model.module.student[0].bias.grad[0] += 1
    out["edited"] = multiproc.outcome(lambda: dloss.lightning.check_grads_synced(model))

    # Accumulating without sync: differing gradients are expected.
    with fabric.no_backward_sync(model):
        step(model, False)
        out["no_sync"] = multiproc.outcome(
            lambda: dloss.lightning.check_grads_synced(model))

    # No DDP at all.
    plain = Distill()
    plain(x).sum().backward()
    out["plain"] = multiproc.outcome(lambda: dloss.lightning.check_grads_synced(plain))
    return out


def _rank(rank, world):
    try:
        import lightning  # noqa: F401
    except ImportError as e:
        raise AssertionError(
            "Lightning is not installed (%s): run bash scripts/setup.sh, "
            "which installs test/requirements.txt" % e)
    out = _trainer_runs()
    out.update(_fabric_runs(rank))
    return out


class LightningTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = multiproc.run(WORLD, _rank, timeout=240)

    def outcomes(self, key):
        return [r[key] for r in self.results]

    def check_raised(self, messages, *expected, absent=()):
        self.assertEqual(len(messages), WORLD)
        for rank, message in enumerate(messages):
            with self.subTest(rank=rank):
                self.assertIsNotNone(message)
                self.assertIn("dloss error [rank %d" % rank, message)
                for text in expected:
                    self.assertIn(text, message)
                for text in absent:
                    self.assertNotIn(text, message)

    def test_trainer_passes(self):
        self.assertEqual(self.outcomes("automatic"), [None] * WORLD)
        self.assertEqual(self.outcomes("manual_backward"), [None] * WORLD)

    def test_trainer_loss_backward_bypasses_ddp(self):
        self.check_raised(
            self.outcomes("loss_backward"), "GradSyncCheck",
            "optimizer step 0", "4 of 4 parameters",
            "student.0.weight differs", "student.2.bias differs",
            "self.manual_backward(loss), not loss.backward()",
            absent=("teacher",))

    def test_every_n_steps(self):
        self.check_raised(self.outcomes("odd_every_1"), "optimizer step 1",
                          "net.student.0.weight differs")
        self.assertEqual(self.outcomes("odd_every_2"), [None] * WORLD)

    def test_fabric_direct_call(self):
        line = multiproc.line_of(__file__, "direct call")
        where = "Submodule student of the DDP-wrapped model was called " \
            "directly at "
        self.check_raised(
            self.outcomes("direct_watched"), "check_grads_synced",
            "4 of 4 parameters", "student.0.weight differs",
            "student.0.bias differs", "student.2.weight differs",
            "student.2.bias differs", where,
            "test_lightning.py:%d" % line,
            "call the DDP-wrapped model (or fabric-wrapped module)",
            absent=("teacher", "submodule student.0"))

    def test_fabric_hooks_from_first_check(self):
        first, second = zip(*self.outcomes("direct_steps"))
        self.check_raised(first, "student.2.weight differs",
                          "dloss.lightning.watch(model)",
                          absent=("called directly at",))
        self.check_raised(second, "student.2.weight differs",
                          "test_lightning.py:%d" % multiproc.line_of(__file__, "direct call"))

    def test_fabric_passes(self):
        self.assertEqual(self.outcomes("wrapped"), [[None, None]] * WORLD)
        self.assertEqual(self.outcomes("mixed"), [None] * WORLD)
        self.assertEqual(self.outcomes("no_sync"), [None] * WORLD)

    def test_fabric_edited_gradient(self):
        self.check_raised(self.outcomes("edited"), "1 of 4 parameters",
                          "student.0.bias differs", "edits .grad",
                          absent=("called directly",))

    def test_plain_module(self):
        self.check_raised(self.outcomes("plain"), "student.0.weight differs",
                          "not wrapped in DDP")

    def test_one_process(self):
        # No process group at all: nothing to compare, nothing to fail.
        import lightning.pytorch as pl

        import dloss.lightning

        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = Distill()

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=2, logger=False,
            enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[dloss.lightning.GradSyncCheck()])
        trainer.fit(Module(), torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.randn(4, 6)), batch_size=2))
        self.assertEqual(trainer.global_step, 2)

    def test_imports(self):
        # dloss never imports Lightning; dloss.lightning without it says
        # what to install.
        code = (
            "import sys\n"
            "import dloss\n"
            "assert 'lightning' not in sys.modules, 'dloss imported it'\n"
            "sys.modules['lightning'] = None\n"
            "try:\n"
            "    import dloss.lightning\n"
            "except ImportError as e:\n"
            "    print(e)\n")
        done = subprocess.run([sys.executable, "-c", code], text=True,
                              capture_output=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("dloss.lightning needs Lightning", done.stdout)
        self.assertIn("pip install lightning", done.stdout)


if __name__ == "__main__":
    unittest.main()
