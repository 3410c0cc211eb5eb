"""Errors from Python: every bad input fails with a dloss.Error within the
deadline, never a hang or a crash, on every rank that waits on it.

Real processes on Gloo (test/python/multiproc.py), 2 ranks, a 5 s dloss
deadline. A bad input on one rank fails every rank in the same call with
the same message (the preflight carries each rank's own checks); a rank
that never calls is named by its peers at the deadline. Each case's time to
fail is measured around the call on every rank and printed as a
"time-to-error" table at the end.

Non-contiguous inputs are accepted, not rejected (a transposed W, a strided
slice, an expanded tensor): the runtime makes operands contiguous where its
kernels need it; the tests check that they give the contiguous result.
"""

import os
import signal
import sys
import tempfile
import threading
import time
import unittest

import torch
import torch.multiprocessing as mp

import multiproc

WORLD = 2
DEADLINE = 5.0  # the runs' dloss timeout, seconds
MARGIN = 3.0  # for the peers' diagnosis (store reads) and a loaded machine
FAST = 2.0  # a preflight failure: one small collective

# (case, [seconds per rank]) of every measured failure, for the table.
TIMES = []

# Flight records of the timed-out runs go here, not into the working
# directory, unless the caller chose (ctest does). The ranks inherit it.
os.environ.setdefault("DLOSS_FLIGHT_DIR", tempfile.mkdtemp(prefix="dloss-"))


def tearDownModule():
    if not TIMES:
        return
    width = max(len(case) for case, _ in TIMES)
    lines = ["time-to-error (seconds in the failing call, per rank):"]
    for case, seconds in TIMES:
        cells = ", ".join("rank %d %s" % (r, "-" if s is None else
                                          "%.1f ms" % (1000 * s))
                          for r, s in enumerate(seconds))
        lines.append("  %-*s  %s" % (width, case, cells))
    sys.stderr.write("\n".join(lines) + "\n")


def _outcome(fn):
    """What calling fn() did: ("error", fields, seconds) for a dloss.Error,
    ("ok", value, seconds) otherwise. Any other exception propagates (the
    rank fails, and the test with it)."""
    import dloss
    start = time.monotonic()
    try:
        value = fn()
    except dloss.Error as e:
        return ("error", {"message": str(e), "problem": e.problem,
                          "hint": e.hint, "rank": e.rank, "op": e.op,
                          "location": e.location,
                          "runtime_error": isinstance(e, RuntimeError)},
                time.monotonic() - start)
    return ("ok", value, time.monotonic() - start)


# ---------------------------------------------------------------------------
# The bad inputs that the ranks see in the same call (one run, in sequence).
# ---------------------------------------------------------------------------


def _toy_graph():
    """x f32 [?, 4] (grad), labels i64 [?] (indices into the gathered
    batch: a size the plan does not know), scale f32 [] (replicated, not
    differentiated)."""
    import dloss
    g = dloss.Graph("toy")
    x = g.input("x", torch.float32, [-1, 4], grad=True)
    labels = g.input("labels", torch.int64, [-1])
    scale = g.input("scale", torch.float32, [], replicated=True)
    logits = g.matmul(x, g.all_gather(x, 0), transpose_b=True) * scale
    per_row = g.cross_entropy(logits, labels)
    total = g.all_reduce(g.reduce(per_row, "sum", [0]), "sum")
    g.set_loss(total / g.to_tensor(g.global_size(x, 0)))
    return g


def _bad_inputs(rank, world):
    import dloss
    torch.manual_seed(0)  # the same W and weights on every rank
    toy = dloss.compile(_toy_graph())
    arcface = dloss.ArcFaceLoss(10, 8)
    cosface = dloss.CosFaceLoss(10, 8)
    clip = dloss.ClipLoss()
    pfc = dloss.PartialFC(8, 10, margin_loss=dloss.CombinedMarginLoss(
        64, 1.0, 0.5, 0.0))
    gen = torch.Generator().manual_seed(rank + 1)
    emb = torch.randn(3, 8, generator=gen)
    labels = torch.tensor([1, 9, 4]) if rank == 0 else torch.tensor([0, 2, 7])
    x = torch.randn(3, 4, generator=gen)
    toy_labels = torch.tensor([0, 3, 5])  # the gathered batch has 6 rows
    scale = torch.tensor(2.0)
    bad = rank == 1

    def feat(n=3, d=8):
        return torch.randn(n, d, generator=gen)

    cases = [
        ("wrong dtype (f64 for f32)",
         lambda: toy(x.double() if bad else x, toy_labels, scale)),
        ("wrong dtype, drop-in (f64 embeddings)",
         lambda: arcface(emb.double() if bad else emb, labels)),
        ("int32 labels, compiled loss",
         lambda: toy(x, toy_labels.int() if bad else toy_labels, scale)),
        ("Python float for a 2-d tensor",
         lambda: toy(1.0 if bad else x, toy_labels, scale)),
        ("dimensionality (1-d for 2-d)",
         lambda: toy(x[0] if bad else x, toy_labels, scale)),
        ("shapes disagree across ranks (dim 16 vs 8)",
         lambda: clip(feat(3, 16 if bad else 8), feat(3, 16 if bad else 8),
                      10.0)),
        ("labels require grad (ArcFace)",
         lambda: arcface(emb.clone().requires_grad_(),
                         labels.float().requires_grad_() if bad else labels)),
        ("undifferentiated input requires grad",
         lambda: toy(x.clone().requires_grad_(), toy_labels,
                     scale.clone().requires_grad_())),
        ("label >= num_classes (ArcFace)",
         lambda: arcface(emb, torch.tensor([0, 10, 1]) if bad else labels)),
        ("negative label (CosFace)",
         lambda: cosface(emb, torch.tensor([0, 1, -1]) if bad else labels)),
        ("label >= num_classes (PartialFC)",
         lambda: pfc(emb, torch.tensor([0, 10, 1]) if bad else labels)),
        ("meta device tensor",
         lambda: arcface(emb.to("meta") if bad else emb, labels)),
        ("a different loss on one rank",
         lambda: (cosface if bad else arcface)(emb, labels)),
        ("wrong number of inputs (every rank)",
         lambda: toy(x, toy_labels, scale, scale)),
        ("unknown keyword (every rank)",
         lambda: toy(x=x, labels=toy_labels, scale=scale, temperature=scale)),
        ("missing input (every rank)",
         lambda: toy(x, toy_labels)),
    ]
    results = {}
    for name, fn in cases:
        results[name] = _outcome(fn)
    # Every failure above left the ranks in step: they go on together.
    results["after"] = _outcome(lambda: (float(arcface(emb, labels)),
                                         float(toy(x, toy_labels, scale))))
    # A Python float is a 0-d tensor of the default dtype (f32 here).
    results["Python float for a 0-d f32"] = _outcome(
        lambda: (float(toy(x, toy_labels, 2.0)),
                 float(toy(x, toy_labels, scale))))
    results["int32 labels, drop-in"] = _outcome(
        lambda: (float(arcface(emb, labels.int())),
                 float(arcface(emb, labels))))
    return results


def _gil(rank, world):
    """Rank 1 arrives 3 s late; rank 0 waits in the loss call meanwhile,
    with a Python thread ticking and a SIGALRM handler armed for 1 s."""
    import dloss
    torch.manual_seed(0)
    loss = dloss.ArcFaceLoss(10, 8)
    emb = torch.randn(4, 8)
    labels = torch.tensor([1, 2, 3, 4])
    expected = float(loss(emb, labels))  # compiled, connected, in step
    if rank == 1:
        time.sleep(3.0)
        return {"value": float(loss(emb, labels)), "expected": expected}
    ticks, fired = [], []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.05)

    thread = threading.Thread(target=tick)
    thread.start()
    previous = signal.signal(signal.SIGALRM,
                             lambda *_: fired.append(time.monotonic()))
    try:
        signal.alarm(1)
        start = time.monotonic()
        value = float(loss(emb, labels))
        end = time.monotonic()
        # The handler runs on this thread between bytecodes: now, if not yet.
        for _ in range(10):
            if fired:
                break
            time.sleep(0.01)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        stop.set()
        thread.join()
    return {"value": value, "expected": expected, "call": end - start,
            "ticks_during_call": len([t for t in ticks
                                      if start + 0.2 < t < end - 0.2]),
            "fired_after": [f - start for f in fired]}


# ---------------------------------------------------------------------------
# Ranks that never make the call: their peers fail at the deadline.
# ---------------------------------------------------------------------------


def _raise_before_loss(rank, world):
    import dloss
    torch.manual_seed(0)
    loss = dloss.ArcFaceLoss(10, 8)
    emb, labels = torch.randn(4, 8), torch.tensor([1, 2, 3, 4])
    float(loss(emb, labels))
    if rank == 1:
        try:
            raise ValueError("the data loader broke")
        except ValueError:
            # Stays alive and goes on without calling the loss.
            time.sleep(DEADLINE + 2)
            return ("skipped", None, None)
    return _outcome(lambda: float(loss(emb, labels)))


def _skip_a_call(rank, world):
    import dloss
    torch.manual_seed(0)
    loss = dloss.ArcFaceLoss(10, 8)
    emb, labels = torch.randn(4, 8), torch.tensor([1, 2, 3, 4])
    outcome = None
    for _ in range(2 if rank == 1 else 3):
        outcome = _outcome(lambda: float(loss(emb, labels)))
        if outcome[0] == "error":
            break
    return outcome


def _gather_while_peer_calls_loss(rank, world):
    import dloss
    torch.manual_seed(0)
    loss = dloss.ArcFaceLoss(10, 8)
    emb, labels = torch.randn(4, 8), torch.tensor([1, 2, 3, 4])
    float(loss(emb, labels))
    if rank == 1:  # skips the loss and gathers a metric instead
        return _outcome(lambda: dloss.all_gather(torch.ones(2, 3)))
    return _outcome(lambda: float(loss(emb, labels)))


def _exiting_rank_main(rank, port, queue):
    """A rank of a 2-process job whose rank 1 raises and exits before the
    second call (multiproc.run counts a dead rank as a failed run)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(WORLD),
                      OMP_NUM_THREADS="1")
    import dloss
    dloss.init(backend="gloo", timeout=DEADLINE)
    torch.manual_seed(0)
    loss = dloss.ArcFaceLoss(10, 8)
    emb, labels = torch.randn(4, 8), torch.tensor([1, 2, 3, 4])
    float(loss(emb, labels))
    if rank == 1:
        queue.put((rank, ("exited", None, None)))
        queue.close()
        queue.join_thread()
        os._exit(1)  # as an uncaught exception ends the process
    queue.put((rank, _outcome(lambda: float(loss(emb, labels)))))
    queue.close()
    queue.join_thread()
    os._exit(0)


class ErrorsTest(unittest.TestCase):

    def test_a_rank_that_gathers_while_its_peer_calls_the_loss(self):
        """Rank 1's shape exchange (dloss.all_gather) meets rank 0's
        preflight (the loss): the ranks are in different calls. The lengths
        of an exchange travel first, so both fail at once, saying so, where
        Gloo's transport would abort the rank receiving the longer message.
        """
        outcomes = multiproc.run(WORLD, _gather_while_peer_calls_loss,
                                 dloss_timeout=DEADLINE, timeout=60)
        for r, (status, value, seconds) in enumerate(outcomes):
            with self.subTest(rank=r):
                self.assertEqual(status, "error", value)
                self.assertIn("found the ranks in different calls",
                              value["message"])
                self.assertIn("rank 0: ", value["message"])
                self.assertIn("same dloss calls in the same order",
                              value["hint"])
                self.assertLess(seconds, FAST)

    def assert_same_error_everywhere(self, outcomes, expected, within=FAST,
                                     hint=None):
        for r, (status, value, seconds) in enumerate(outcomes):
            with self.subTest(rank=r):
                self.assertEqual(status, "error", value)
                self.assertIn(expected, value["message"])
                self.assertTrue(value["runtime_error"])
                # The same problem on every rank; where (the op and line of
                # each rank's own call) may differ.
                self.assertEqual(value["problem"], outcomes[0][1]["problem"])
                self.assertLess(seconds, within)
                if hint:
                    self.assertIn(hint, value["hint"])
                # Located at the user's call of the loss (this file's line
                # in _bad_inputs), never in dloss's own sources.
                path, line = value["location"].rsplit(":", 1)
                self.assertEqual(os.path.abspath(path),
                                 os.path.abspath(__file__), value["message"])
                self.assertIn(" at %s]" % value["location"], value["message"])

    def test_guard_needs_a_group(self):
        # Losses run as one process without a group (test_one_process.py);
        # the guard checks a group's collectives, so it needs one.
        import dloss
        self.assertFalse(torch.distributed.is_initialized())
        start = time.monotonic()
        with self.assertRaises(dloss.Error) as caught:
            dloss.guard()
        TIMES.append(("no initialised group (dloss.guard)",
                      [time.monotonic() - start]))
        self.assertIsInstance(caught.exception, RuntimeError)
        self.assertIn("no torch.distributed process group is initialised",
                      caught.exception.problem)
        self.assertIn("dloss.init()", caught.exception.hint)

    def test_bad_inputs_fail_every_rank_in_the_same_call(self):
        ranks = multiproc.run(WORLD, _bad_inputs, dloss_timeout=DEADLINE)
        results = {name: [ranks[r][name] for r in range(WORLD)]
                   for name in ranks[0]}
        for name, outcomes in results.items():
            if name not in ("after", "int32 labels, drop-in",
                            "Python float for a 0-d f32"):
                TIMES.append((name, [o[2] for o in outcomes]))
        same = self.assert_same_error_everywhere
        same(results["wrong dtype (f64 for f32)"],
             "]: preflight of @toy: rank 1 passed argument 0 (x) "
             "as f64 [3, 4], expected f32 [?, 4]",
             hint="Pass every rank inputs of the function's argument types")
        same(results["wrong dtype, drop-in (f64 embeddings)"],
             "rank 1 called @arcface_grad of plan fingerprint")
        same(results["wrong dtype, drop-in (f64 embeddings)"],
             "with inputs of dtypes (f64, i64, f64)",
             hint="pass the same dtypes on every rank")
        same(results["int32 labels, compiled loss"],
             "rank 1 passed argument 1 (labels) as i32 [3], expected i64 [?]")
        same(results["Python float for a 2-d tensor"],
             "rank 1 passed argument 0 (x) with 0 dims [], expected f32 "
             "[?, 4]")
        same(results["dimensionality (1-d for 2-d)"],
             "rank 1 passed argument 0 (x) with 1 dims [4], expected f32 "
             "[?, 4]")
        same(results["shapes disagree across ranks (dim 16 vs 8)"],
             "rank 1 passed argument 0 (image) of shape [3, 16], rank 0 "
             "[3, 8]", hint="Ranks may differ only in dimension 0")
        same(results["labels require grad (ArcFace)"],
             "rank 1 passed argument 1 (labels) as f32 [3] requiring grad, "
             "but @arcface is not differentiated with respect to it (only "
             "with respect to embeddings, weights)",
             hint="Pass the input detached (x.detach())")
        same(results["undifferentiated input requires grad"],
             "ranks 0,1 passed argument 2 (scale) as f32 [] requiring grad, "
             "but @toy is not differentiated with respect to it (only with "
             "respect to x): no gradient would reach it",
             hint="declare it with dloss.grad")
        same(results["label >= num_classes (ArcFace)"],
             "rank 1 passed argument 1 (labels) with value 10 at [1], "
             "outside [0, 10): it indexes axis 0 (size 10) of "
             "dloss.fused_similarity",
             hint="check the labels those ranks passed")
        same(results["negative label (CosFace)"],
             "rank 1 passed argument 1 (labels) with value -1 at [2], "
             "outside [0, 10)")
        same(results["meta device tensor"],
             "rank 1 passed argument 0 (embeddings) on meta, a device dloss "
             "does not compute on")
        same(results["a different loss on one rank"],
             "preflight: ranks ran different plans: rank 0 called "
             "@arcface_grad of plan fingerprint")
        same(results["a different loss on one rank"],
             "rank 1 called @cosface_grad",
             hint="Every rank must call the same compiled losses")
        # PartialFC gathers the labels first: its fused kernel sees the bad
        # one on every rank, in the same step (each rank names itself).
        for r, (status, value, seconds) in enumerate(
                results["label >= num_classes (PartialFC)"]):
            self.assertEqual(status, "error", value)
            self.assertEqual(value["rank"], r)
            self.assertEqual(value["op"], "dloss.sharded_softmax")
            self.assertIn("= 10 is out of range [0, 10)", value["problem"])
            self.assertLess(seconds, FAST)
        # Mistakes in the call itself are raised by each rank before any
        # collective (the same code runs on every rank).
        same(results["wrong number of inputs (every rank)"],
             "@toy takes 3 inputs (x, labels, scale), got 4")
        same(results["unknown keyword (every rank)"],
             "@toy has no input named 'temperature'")
        same(results["missing input (every rank)"],
             "@toy is missing input(s) scale")
        # After all that, the ranks still run together.
        for status, value, _ in results["after"]:
            self.assertEqual(status, "ok", value)
        # The drop-ins take any integer labels; a number passes for a 0-d
        # tensor of the default dtype.
        for name in ("int32 labels, drop-in", "Python float for a 0-d f32"):
            for status, value, _ in results[name]:
                self.assertEqual(status, "ok", value)
                self.assertEqual(value[0], value[1])

    def test_the_gil_is_released_while_a_call_waits(self):
        waiting, late = multiproc.run(WORLD, _gil, dloss_timeout=DEADLINE)
        self.assertEqual(waiting["value"], waiting["expected"])
        self.assertEqual(late["value"], late["expected"])
        self.assertGreater(waiting["call"], 2.5)
        # A Python thread ran all through the 3 s wait (a tick per 50 ms).
        self.assertGreater(waiting["ticks_during_call"], 20, waiting)
        # The SIGALRM broke nothing, and its Python handler ran: Python runs
        # handlers on the main thread between bytecodes, so at the latest
        # when the call returns (bounded by the deadline).
        self.assertEqual(len(waiting["fired_after"]), 1, waiting)
        self.assertGreater(waiting["fired_after"][0], 0.9)
        self.assertLess(waiting["fired_after"][0], waiting["call"] + 0.5)

    def test_a_rank_that_raises_before_the_loss_is_named_at_the_deadline(self):
        outcomes = multiproc.run(WORLD, _raise_before_loss,
                                 dloss_timeout=DEADLINE, timeout=60)
        status, value, seconds = outcomes[0]
        TIMES.append(("rank 1 raises, stays alive, never calls",
                      [seconds, None]))
        self.assertEqual(outcomes[1][0], "skipped")
        self.assertEqual(status, "error", value)
        self.assertEqual(value["rank"], 0)
        self.assertIn("preflight of @arcface_grad", value["problem"])
        self.assertIn("rank 1", value["problem"])
        self.assertIn("deadline of 5 s", value["problem"])
        self.assertLess(seconds, DEADLINE + MARGIN)

    def test_a_rank_that_skips_a_call_is_named_at_the_deadline(self):
        outcomes = multiproc.run(WORLD, _skip_a_call, dloss_timeout=DEADLINE,
                                 timeout=60)
        status, value, seconds = outcomes[0]
        TIMES.append(("rank 1 calls 2 times, rank 0 3 times",
                      [seconds, None]))
        self.assertEqual(outcomes[1][0], "ok")  # it made all its calls
        self.assertEqual(status, "error", value)
        self.assertIn("rank 1 never arrived", value["problem"])
        self.assertIn("preflight of @arcface_grad", value["problem"])
        self.assertLess(seconds, DEADLINE + MARGIN)

    def test_a_rank_that_exits_is_named_without_waiting(self):
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = multiproc.free_port()
        procs = [ctx.Process(target=_exiting_rank_main,
                             args=(r, port, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        try:
            results = dict(queue.get(timeout=60) for _ in range(WORLD))
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
        status, value, seconds = results[0]
        TIMES.append(("rank 1 raises and exits", [seconds, None]))
        self.assertEqual(results[1][0], "exited")
        self.assertEqual(status, "error", value)
        self.assertIn("rank 1", value["problem"])
        self.assertLess(seconds, DEADLINE)


# ---------------------------------------------------------------------------
# Strides: any layout in, the contiguous result out.
# ---------------------------------------------------------------------------


def _strided(rank, world):
    import dloss
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(rank + 1)

    def compare(loss_fn, make_inputs):
        """(loss, max gradient difference) of loss_fn on the strided inputs
        against the same values made contiguous."""
        strided = make_inputs()
        leaves = [t for t in strided if t.requires_grad]
        for leaf in leaves:
            leaf.grad = None
        value = loss_fn(*[t for t in strided])
        value.backward()
        grads = [leaf.grad.clone() for leaf in leaves]
        dense = [t.detach().contiguous().requires_grad_(t.requires_grad)
                 for t in strided]
        reference = loss_fn(*dense)
        reference.backward()
        dense_grads = [t.grad for t in dense if t.requires_grad]
        return (float(value), float(reference),
                max(float((g - d).abs().max())
                    for g, d in zip(grads, dense_grads)))

    def transposed(n, d):
        return torch.randn(d, n, generator=gen).t().requires_grad_()

    def sliced(n, d):
        return torch.randn(n, 2 * d, generator=gen)[:, ::2].requires_grad_()

    def expanded(n, d):
        return torch.randn(1, d, generator=gen).expand(n, d).requires_grad_()

    labels = torch.tensor([3, 1, 7, 2, 5, 0, 9, 4])[rank:rank + 6:2]  # strided
    arcface = dloss.ArcFaceLoss(10, 8)
    pfc = dloss.PartialFC(8, 10, margin_loss=dloss.CombinedMarginLoss(
        64, 1.0, 0.5, 0.0))
    toy = dloss.compile(_toy_graph(), fuse=False)
    scale = torch.tensor(3.0)
    return {
        "ClipLoss": compare(dloss.ClipLoss(), lambda: (
            transposed(3, 8), sliced(3, 8),
            torch.tensor(10.0, requires_grad=True))),
        "SigLipLoss": compare(
            lambda a, b: dloss.SigLipLoss()(a, b, 10.0, -5.0),
            lambda: (sliced(3, 8), transposed(3, 8))),
        "ArcFaceLoss": compare(lambda e: arcface(e, labels),
                               lambda: (transposed(3, 8),)),
        "PartialFC": compare(lambda e: pfc(e, labels),
                             lambda: (sliced(3, 8),)),
        "compiled, unfused": compare(
            lambda a: toy(a, torch.tensor([0, 4, 5]), scale),
            lambda: (expanded(3, 4),)),
    }


class StridesTest(unittest.TestCase):

    def test_non_contiguous_inputs_give_the_contiguous_result(self):
        for rank, results in enumerate(multiproc.run(
                WORLD, _strided, dloss_timeout=30)):
            for name, (value, reference, grad_diff) in results.items():
                with self.subTest(loss=name, rank=rank):
                    self.assertEqual(value, reference)
                    self.assertLessEqual(grad_diff, 1e-6)


def _two_devices(rank, world):
    import dloss
    loss = dloss.ArcFaceLoss(10, 8).cuda()
    # CUDA embeddings, CPU labels.
    return _outcome(lambda: loss(torch.randn(4, 8).cuda(),
                                 torch.tensor([1, 2, 3, 4])))


@unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA torch and GPU")
class DevicesTest(unittest.TestCase):

    def test_inputs_on_two_devices(self):
        status, value, seconds = multiproc.run(1, _two_devices,
                                               backend="nccl")[0]
        self.assertEqual(status, "error", value)
        self.assertIn("on different devices", value["message"])


if __name__ == "__main__":
    unittest.main()
