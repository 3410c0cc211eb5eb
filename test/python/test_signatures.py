"""Signature parity: every parameter of each installed original (OpenCLIP,
pytorch-metric-learning, torchmetrics, sentence-transformers, at the
versions test/requirements*.txt pins) is a parameter of its dloss drop-in, in __init__ and in forward (or of
the function it replaces). A keyword a new upstream release adds thus fails
here, not in a user's training run. Parameters that mean nothing to dloss are
still accepted and documented (docs/Migration.md).

PML's losses take most keywords through **kwargs, which their base classes'
__init__ consume (distance, reducer, regularizers, collect_stats): those count
as the original's parameters too, and dloss's own base classes' named
parameters count for dloss (a catch-all **kwargs does not). Keywords are
compared by name; a parameter
the original takes positionally must sit at the same position in dloss's.
No process group is needed: only signatures are read."""

import inspect
import unittest

import dloss

import upstream


def _parameters(fn):
    """The named parameters of fn, without self, *args and **kwargs."""
    return [p for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL,
                                                   p.VAR_KEYWORD)]


# What an original's constructor needs before a keyword can be tried.
_REQUIRED = {"ArcFaceLoss": dict(num_classes=10, embedding_size=4),
             "CosFaceLoss": dict(num_classes=10, embedding_size=4)}


def _init_parameters(cls, package, probe=False):
    """cls.__init__'s parameters, and, where it forwards **kwargs, those of
    every __init__ in its method resolution order from `package`. With
    `probe`, an inherited keyword counts only if the class takes it: PML's
    NTXentLoss passes mat_based_loss to its base itself, so passing it
    again is a TypeError there and no parameter of NTXentLoss."""
    names = [p.name for p in _parameters(cls.__init__)]
    forwards = any(p.kind == p.VAR_KEYWORD for p in
                   inspect.signature(cls.__init__).parameters.values())
    if forwards:
        for base in cls.__mro__[1:]:
            init = base.__dict__.get("__init__")
            if init is None or not (base.__module__ or "").startswith(package):
                continue
            for p in _parameters(init):
                if p.name in names:
                    continue
                if probe:
                    value = None if p.default is p.empty else p.default
                    arguments = dict(_REQUIRED.get(cls.__name__, {}))
                    arguments.setdefault(p.name, value)
                    try:
                        cls(**arguments)
                    except TypeError as e:
                        print("%s.%s: %s is set by the class itself (%s)" %
                              (package, cls.__name__, p.name, e))
                        continue
                names.append(p.name)
    return names


def _positional(fn):
    return [p.name for p in _parameters(fn)
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


class SignatureParity(unittest.TestCase):

    def compare(self, original, ours, package, what):
        """Every parameter of `original` (its __init__ and forward, or the
        function itself) is one of `ours`; positional ones in the same
        place."""
        if inspect.isclass(original):
            pairs = [("__init__", _init_parameters(original, package, True),
                      _positional(original.__init__), ours.__init__),
                     ("forward", [p.name for p in
                                  _parameters(original.forward)],
                      _positional(original.forward), ours.forward)]
        else:
            pairs = [("", [p.name for p in _parameters(original)],
                      _positional(original), ours)]
        for method, names, positional, our_fn in pairs:
            label = "%s%s" % (what, "." + method if method else "")
            if method == "__init__":
                accepted = _init_parameters(ours, "dloss")
            else:
                accepted = [p.name for p in _parameters(our_fn)]
            missing = [n for n in names if n not in accepted]
            self.assertEqual(missing, [], "%s: dloss does not accept %s "
                             "(the original's signature: %s)" %
                             (label, missing, names))
            ours_positional = _positional(our_fn)
            self.assertEqual(ours_positional[:len(positional)], positional,
                             "%s: positional parameters differ" % label)
            print("%s: %d parameters, all accepted" % (label, len(names)))

    def test_openclip(self):
        oc = upstream.open_clip_loss()
        print("open_clip.loss imported", upstream.OPEN_CLIP_IMPORT)
        for name in ("ClipLoss", "SigLipLoss", "DistillClipLoss",
                     "CoCaLoss"):
            with self.subTest(name):
                self.compare(getattr(oc, name), getattr(dloss, name),
                             oc.__name__, "open_clip " + name)

    def test_pytorch_metric_learning(self):
        pml = upstream.pml()
        from pytorch_metric_learning import losses
        from pytorch_metric_learning.utils import distributed
        for name in ("ArcFaceLoss", "CosFaceLoss", "NTXentLoss",
                     "SupConLoss"):
            with self.subTest(name):
                self.compare(getattr(losses, name), getattr(dloss, name),
                             pml.__name__, "pytorch_metric_learning " + name)
        with self.subTest("DistributedLossWrapper"):
            # The wrapper is a function returning the dloss loss: its
            # parameters are the original's constructor's.
            original = distributed.DistributedLossWrapper
            names = _init_parameters(original, pml.__name__, True)
            accepted = [p.name for p in
                        _parameters(dloss.DistributedLossWrapper)]
            missing = [n for n in names if n not in accepted]
            self.assertEqual(missing, [], "DistributedLossWrapper: dloss "
                             "does not accept %s" % missing)
            print("pytorch_metric_learning DistributedLossWrapper: %d "
                  "parameters, all accepted" % len(names))

    def test_sentence_transformers(self):
        from sentence_transformers.sentence_transformer import losses

        import dloss.sentence_transformers as dst
        for name in dst.__all__:
            with self.subTest(name):
                self.compare(getattr(losses, name), getattr(dst, name),
                             "sentence_transformers",
                             "sentence_transformers " + name)

    def test_torchmetrics(self):
        tm = upstream.torchmetrics()
        from torchmetrics.utilities import distributed
        self.compare(distributed.gather_all_tensors, dloss.gather_all_tensors,
                     tm.__name__, "torchmetrics gather_all_tensors")


if __name__ == "__main__":
    unittest.main()
