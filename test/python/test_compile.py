"""dloss.compile, dloss.Graph and dloss.init: a loss from MLIR text, a .mlir
file or a graph built in Python, called by position or by name, on 1 and 3
real Gloo ranks with uneven batches, against eager torch on the global
batch; and their errors."""

import os
import subprocess
import sys
import unittest

import torch
import torch.nn.functional as F

import multiproc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CLIP_MLIR = os.path.join(ROOT, "examples", "clip.mlir")
SIZES = [4, 1, 6]
DIM = 5


def data(rows):
    g = torch.Generator().manual_seed(3)
    image = F.normalize(torch.randn(rows, DIM, generator=g), dim=1)
    text = F.normalize(torch.randn(rows, DIM, generator=g), dim=1)
    return image, text


def python_graph(grad_mode="ddp"):
    import dloss
    g = dloss.Graph("pyclip")
    image = g.input("image", torch.float32, [-1, DIM], grad=True)
    text = g.input("text", torch.float32, [-1, DIM], grad=True)
    scale = g.input("scale", torch.float32, [], grad=True, replicated=True)
    labels = g.arange(g.shard_offset(image, 0), g.dim(image, 0))
    logits = g.matmul(image, g.all_gather(text, 0), transpose_b=True) * scale
    total = g.all_reduce(g.reduce(g.cross_entropy(logits, labels), "sum",
                                  [0]))
    g.set_loss(total / g.to_tensor(g.global_size(image, 0)), grad_mode)
    return g


def reference(sizes):
    """Loss and gradients of one process on the global batch: the CLIP
    example's loss (both directions) and the one-direction Python graph's."""
    image, text = data(sum(sizes))
    out = {}
    for name in ("clip", "pyclip"):
        i = image.clone().requires_grad_()
        t = text.clone().requires_grad_()
        s = torch.tensor(6.0, requires_grad=True)
        labels = torch.arange(sum(sizes))
        loss = F.cross_entropy(s * i @ t.T, labels)
        if name == "clip":
            loss = (loss + F.cross_entropy(s * t @ i.T, labels)) / 2
        loss.backward()
        out[name] = (loss.detach(), i.grad, t.grad, s.grad)
    return out


def run_rank(rank, world, sizes):
    import dloss
    image, text = data(sum(sizes))
    start = sum(sizes[:rank])
    rows = slice(start, start + sizes[rank])
    results = {}
    with open(CLIP_MLIR) as f:
        text_source = f.read()
    losses = {
        "clip-path": (dloss.compile(CLIP_MLIR), "clip"),
        "clip-text": (dloss.compile(text_source, fuse=False), "clip"),
        "pyclip": (dloss.compile(python_graph()), "pyclip"),
    }
    for key, (fn, ref) in losses.items():
        i = image[rows].clone().requires_grad_()
        t = text[rows].clone().requires_grad_()
        s = torch.tensor(6.0, requires_grad=True)
        if key == "clip-text":
            loss = fn(scale=s, image=i, text=t)  # by name, any order
        else:
            loss = fn(i, t, s)
        loss.backward()
        results[key] = (ref, loss.detach(), i.grad, t.grad, s.grad,
                        fn.grad_mode, fn.argument_names)
    # grad_mode="global" overrides the loss's ddp: dF/dx_r, full dF/ds.
    fn = dloss.compile(CLIP_MLIR, grad_mode="global")
    i = image[rows].clone().requires_grad_()
    t = text[rows].clone().requires_grad_()
    s = torch.tensor(6.0, requires_grad=True)
    loss = fn(i, t, s)
    loss.backward()
    results["clip-global"] = ("clip", loss.detach(), i.grad, t.grad, s.grad,
                              fn.grad_mode, fn.argument_names)
    return results


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


class CompileTest(unittest.TestCase):

    def check_world(self, sizes):
        world = len(sizes)
        ranks = multiproc.run(world, run_rank, sizes)
        refs = reference(sizes)
        starts = [sum(sizes[:r]) for r in range(world)]
        worst = 0.0
        for key in ("clip-path", "clip-text", "pyclip", "clip-global"):
            ref_name = ranks[0][key][0]
            loss_ref, gi_ref, gt_ref, gs_ref = refs[ref_name]
            ddp = ranks[0][key][5] == "ddp"
            self.assertEqual(ranks[0][key][5],
                             "global" if key == "clip-global" else "ddp")
            self.assertEqual(ranks[0][key][6], ["image", "text", "scale"])
            # ddp: rank r gets N * dF/dx_r and its share of N * dF/ds.
            factor = world if ddp else 1
            gs_total = sum(r[key][4] for r in ranks) / world if ddp else None
            for r, out in enumerate(ranks):
                _, loss, gi, gt, gs, _, _ = out[key]
                rows = slice(starts[r], starts[r] + sizes[r])
                self.assertLess(abs(loss - loss_ref).item(), 1e-5, key)
                worst = max(worst, rel(gi / factor, gi_ref[rows]),
                            rel(gt / factor, gt_ref[rows]))
                if not ddp:
                    worst = max(worst, rel(gs, gs_ref))
            if ddp:
                worst = max(worst, rel(gs_total, gs_ref))
        print("METRIC compile world=%d worst_rel=%.3g" % (world, worst),
              file=sys.stderr)
        self.assertLess(worst, 1e-5)

    def test_one_rank(self):
        self.check_world([5])

    def test_three_uneven_ranks(self):
        self.check_world(SIZES)


def bad_calls(rank, world):
    import dloss
    messages = {}
    fn = dloss.compile(CLIP_MLIR)
    image = torch.zeros(2, 3)
    cases = {
        "keyword": lambda: fn(image, image, torch.tensor(1.0), bogus=image),
        "missing": lambda: fn(image, image),
        "too-many": lambda: fn(image, image, torch.tensor(1.0), image),
        "twice": lambda: fn(image, image, torch.tensor(1.0), image=image),
        "does-not-compile": lambda: dloss.compile(
            "func.func @f(%x: tensor<?xf32>) -> tensor<f32> attributes "
            "{dloss.loss} {\n  %y = dloss.bogus %x : tensor<?xf32>\n"
            "  return %y : tensor<f32>\n}\n"),
        "no-such-file": lambda: dloss.compile("no/such/loss.mlir"),
        "not-a-source": lambda: dloss.compile(42),
        "grad-mode": lambda: dloss.compile(CLIP_MLIR, grad_mode="sum"),
        "graph-mistake": lambda: dloss.Graph("g").matmul(None, None),
    }
    for key, call in cases.items():
        try:
            call()
            messages[key] = None
        except dloss.Error as e:
            messages[key] = ("dloss.Error", str(e))
        except Exception as e:  # noqa: B902 - reported as a failure
            messages[key] = (type(e).__name__, str(e))
    return messages


class CompileErrorTest(unittest.TestCase):

    def test_errors_say_what_and_where(self):
        messages = multiproc.run(1, bad_calls)[0]
        expected = {
            "keyword": "no input named 'bogus'",
            "missing": "missing input(s) scale",
            "too-many": "takes 3 inputs",
            "twice": "given twice",
            "does-not-compile": "did not compile",
            "no-such-file": "neither dloss MLIR text nor an existing file",
            "not-a-source": "not int",
            "grad-mode": "grad_mode must be",
        }
        for key, words in expected.items():
            self.assertIsNotNone(messages[key], key + " raised nothing")
            kind, text = messages[key]
            self.assertEqual(kind, "dloss.Error", "%s: %s" % (key, text))
            self.assertIn(words, text, key)
        # The compiler's message carries the loss's source location.
        self.assertIn(":2:", messages["does-not-compile"][1])
        # A graph mistake is a TypeError from pybind11 (None is no tensor).
        self.assertIsNotNone(messages["graph-mistake"])


def one_rank_miscalls(rank, world, mistake):
    """Rank 1 makes a malformed call while rank 0 makes a good one."""
    import time
    import dloss
    fn = dloss.compile(CLIP_MLIR)
    image, scale = torch.zeros(2, 3), torch.tensor(1.0)
    calls = {
        "keyword": lambda: fn(image, image, bogus=scale),
        "missing": lambda: fn(image, image),
        "too-many": lambda: fn(image, image, scale, image),
        "not-a-tensor": lambda: fn(image, image, "big"),
    }
    start = time.monotonic()
    try:
        if rank == 1:
            calls[mistake]()
        else:
            fn(image, image, scale)
    except dloss.Error as e:
        return str(e), time.monotonic() - start
    return None, time.monotonic() - start


def graph_op_error(rank, world):
    import dloss
    g = dloss.Graph("bad")
    x = g.input("x", torch.float32, [-1, 4])
    y = g.input("y", torch.float32, [-1, 3])
    try:
        g.matmul(x, y, transpose_b=True)  # 4 vs 3: the line below is blamed
    except dloss.Error as e:
        return str(e), e.location, sys._getframe().f_lineno - 2
    return None


class OneRankMiscallsTest(unittest.TestCase):
    """A mistake in the call on one rank fails every rank in that call's
    preflight, at once, instead of leaving the peers to their deadline."""

    def test_every_rank_fails_fast(self):
        for mistake, words in (("keyword", "no input named 'bogus'"),
                               ("missing", "missing input(s) scale"),
                               ("too-many", "takes 3 inputs"),
                               ("not-a-tensor", "is a str, not a tensor")):
            with self.subTest(mistake=mistake):
                (peer, peer_s), (own, own_s) = multiproc.run(
                    2, one_rank_miscalls, mistake, dloss_timeout=30.0)
                self.assertIsNotNone(own)
                self.assertIn(words, own)
                self.assertIsNotNone(peer)
                self.assertIn("rank 1 passed 4 inputs", peer)
                self.assertLess(max(peer_s, own_s), 5.0)


class NumbersTest(unittest.TestCase):
    """A number passed for an input becomes a 0-d tensor on the device of
    the call's tensors, which the runtime requires to be one (a CUDA call
    with a Python float scale would otherwise mix devices). The meta
    device stands in for CUDA here."""

    def test_a_number_joins_the_tensors_device(self):
        from dloss.compiled import CompiledLoss
        image = torch.empty(4, DIM, device="meta")
        tensors, problem = CompiledLoss._bind(
            "clip", ["image", "text", "scale"], (image, image), {"scale": 10.0})
        self.assertIsNone(problem)
        self.assertEqual([t.device.type for t in tensors], ["meta"] * 3)
        self.assertEqual(tensors[2].dtype, torch.float32)
        cpu, _ = CompiledLoss._bind("clip", ["image", "scale"],
                                    (torch.zeros(2, DIM), 3), {})
        self.assertEqual(cpu[1].device.type, "cpu")
        self.assertEqual(int(cpu[1]), 3)


class GraphErrorTest(unittest.TestCase):

    def test_graph_error_names_python_line(self):
        message, location, line = multiproc.run(1, graph_op_error)[0]
        self.assertIn("test_compile.py:%d" % line, message)


def init_script(env):
    code = ("import dloss, torch.distributed as dist\n"
            "try:\n"
            "    print(dloss.init())\n"
            "    print(dist.get_world_size(), dloss.group.communicator().world_size)"
            "\n"
            "except dloss.Error as e:\n"
            "    print('ERROR', e)\n")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    clean.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=clean,
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


class InitTest(unittest.TestCase):

    def test_no_variables_is_a_world_of_one(self):
        out = init_script({})
        self.assertIn("(0, 1)", out)
        self.assertIn("1 1", out)

    def test_some_variables_missing(self):
        out = init_script({"RANK": "0", "WORLD_SIZE": "2"})
        self.assertIn("ERROR", out)
        self.assertIn("not MASTER_ADDR, MASTER_PORT", out)

    def test_no_group_is_one_process(self):
        # A fresh interpreter that never initialises torch.distributed (a
        # notebook): the drop-in gives the loss of its own batch.
        code = ("import dloss, torch\n"
                "import torch.nn.functional as F\n"
                "torch.manual_seed(0)\n"
                "x, y = torch.randn(3, 4), torch.randn(3, 4)\n"
                "got = dloss.ClipLoss()(x, y, 2.0)\n"
                "z, t = 2.0 * x @ y.T, torch.arange(3)\n"
                "want = (F.cross_entropy(z, t) + F.cross_entropy(z.T, t)) / 2\n"
                "print('LOSS', got.item(), want.item(),\n"
                "      torch.distributed.is_initialized())\n")
        out = subprocess.run([sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=120)
        lines = [l for l in out.stdout.splitlines() if l.startswith("LOSS")]
        self.assertEqual(len(lines), 1, out.stdout + out.stderr)
        got, want, initialised = lines[0].split()[1:]
        self.assertAlmostEqual(float(got), float(want), places=5)
        self.assertEqual(initialised, "False")


if __name__ == "__main__":
    unittest.main()
