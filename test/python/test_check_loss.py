"""dloss.check_loss on real Gloo processes: the seven losses of the issue
(five wrong, two right), a loss that hangs, the seeds' own code
(TorchMetrics' gather_all_tensors in a loss, pytorch-metric-learning's
ArcFaceLoss with its W outside DDP), dloss's own losses, and the command
line. Each must get the right verdict and kinds (check_losses.py has the
losses)."""

import os
import subprocess
import sys
import time
import unittest

import torch

import check_losses as losses
import multiproc

HERE = os.path.dirname(os.path.abspath(__file__))


def check(fn, inputs=None, **kwargs):
    import dloss
    inputs = inputs if inputs is not None else losses.two_views()
    kwargs.setdefault("timeout", 30)
    report = dloss.check_loss(fn, *inputs, **kwargs)
    print("\n%s" % report, file=sys.stderr)
    return report


def kinds(report):
    return {f.kind for f in report.failures}


class CheckLossTest(unittest.TestCase):

    def test_no_autograd_gather(self):
        report = check(losses.clip_no_autograd_gather, losses.clip_inputs())
        self.assertFalse(report.ok)
        self.assertEqual(kinds(report), {"grad_missing_cross_rank",
                                         "uneven"})
        text = str(report)
        self.assertIn("check_losses.py:%d" % multiproc.line_of(
            losses.__file__, "no-grad-gather"), text)
        self.assertIn("dloss.all_gather", text)

    def test_rank_times_n_labels(self):
        report = check(losses.clip_rank_times_n_labels, losses.clip_inputs())
        self.assertEqual(kinds(report), {"uneven"})
        self.assertIn("not n * rank", str(report))

    def test_in_place_all_reduce(self):
        report = check(losses.barlow_in_place_all_reduce)
        self.assertEqual(kinds(report), {"grad_scale"})
        self.assertIn("1/2 = 1/world", str(report))
        self.assertIn("1/3 = 1/world", str(report))
        self.assertIn("torch.distributed.nn.functional.all_reduce",
                      str(report))

    def test_local_batch_norm(self):
        report = check(losses.barlow_local_batch_norm)
        self.assertIn("value", kinds(report))
        self.assertTrue(kinds(report) <= {"value", "grad"})

    def test_per_rank_mean(self):
        # Right on equal batches (per-rank values whose average is the
        # global one), wrong on uneven ones.
        report = check(losses.mse_per_rank_mean)
        self.assertEqual(kinds(report), {"value", "grad"})
        for f in report.failures:
            self.assertNotEqual(len(set(f.sizes)), 1, str(f))
        self.assertEqual(len(report.notes), 2)

    def test_right_losses_pass(self):
        for fn, inputs in ((losses.clip_right, losses.clip_inputs()),
                           (losses.mse_global_mean, None)):
            with self.subTest(fn.__name__):
                report = check(fn, inputs)
                self.assertTrue(report.ok, str(report))
                self.assertEqual(len(report.notes), 4)

    def test_a_skipped_collective_is_a_hang_not_a_hang_of_the_check(self):
        start = time.monotonic()
        report = check(losses.logs_on_rank_zero, worlds=(2,), timeout=8)
        elapsed = time.monotonic() - start
        self.assertEqual(kinds(report), {"hang"})
        self.assertIn("check_losses.py", str(report))  # the rank-0 log
        # The check ends: the guard's deadline, not torch's 30 minutes.
        self.assertLess(elapsed, 120)

    def test_torchmetrics_gather_in_a_loss(self):
        report = check(losses.torchmetrics_gather_in_a_loss,
                       losses.clip_inputs())
        self.assertEqual(kinds(report), {"grad_missing_cross_rank"})
        self.assertIn("torchmetrics", str(report))
        self.assertIn("dloss.gather_all_tensors", str(report))

    def test_arcface_w_outside_ddp(self):
        made = losses.arcface_inputs()
        report = check(losses.arcface_w_outside_ddp, made["inputs"],
                       params=made["params"], worlds=(2,))
        self.assertIn("param_grad", kinds(report))
        self.assertIn("differs between ranks", str(report))

    def test_dloss_losses_pass(self):
        for fn in (losses.dloss_clip_drop_in, losses.dloss_traced_clip):
            with self.subTest(fn.__name__):
                report = check(fn, losses.clip_inputs(), worlds=(3,))
                self.assertTrue(report.ok, str(report))
                self.assertIn("global batch's value on every rank",
                              report.notes[0])

    def test_more_drop_ins_pass(self):
        image, text, scale = losses.clip_inputs()
        report = check(losses.dloss_siglip_drop_in,
                       (image, text, scale, torch.tensor(-2.0)), worlds=(3,))
        self.assertTrue(report.ok, str(report))
        # ArcFace with its W a parameter of the loss: the same gradient on
        # every rank, whose average is one process's.
        embeddings, labels = losses.arcface_inputs()["inputs"]
        report = check(losses.dloss_arcface_drop_in, (embeddings, labels),
                       params=losses.dloss_arcface_module(), worlds=(3,))
        self.assertTrue(report.ok, str(report))
        for fn in (losses.dloss_supcon_drop_in, losses.dloss_ntxent_drop_in):
            with self.subTest(fn.__name__):
                report = check(fn, (embeddings, labels), worlds=(3,))
                self.assertTrue(report.ok, str(report))

    def test_command_line(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [HERE] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
        done = subprocess.run(
            [sys.executable, "-m", "dloss.check_loss",
             "check_losses:mse_per_rank_mean", "--inputs",
             "check_losses:two_views", "--worlds", "2", "--timeout", "30"],
            cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("check_loss mse_per_rank_mean: FAIL (value, grad)",
                      done.stdout)

    def test_bad_calls_say_what_to_do(self):
        import dloss
        cases = [
            (lambda: dloss.check_loss(lambda a, b: a.sum(),
                                      *losses.two_views()),
             ["not importable by name", "top level"]),
            (lambda: dloss.check_loss(losses.mse_global_mean,
                                      torch.randn(3, 2), torch.randn(4, 2)),
             ["first dimensions differ"]),
            (lambda: dloss.check_loss(losses.mse_global_mean,
                                      torch.randn(3, 2), torch.randn(3, 2)),
             ["too few", "at least 6"]),
            (lambda: dloss.check_loss(losses.mse_global_mean,
                                      *losses.two_views(), sizes=[[5, 5]]),
             ["do not add up to the 12 rows"]),
        ]
        for call, words in cases:
            with self.assertRaises(dloss.Error) as caught:
                call()
            for w in words:
                self.assertIn(w, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
