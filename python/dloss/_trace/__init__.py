"""The @dloss.loss tracer (private; dloss/trace.py is its public face). A
loss function runs once on stand-ins, and every torch operation it makes
adds dloss ops to a dloss.Graph at the user's file:line.

Modules, in import order (each imports only those above it):

- locations: the user's (file, line) and the errors that name it;
- control: Python control flow on run-time values, refused;
- values: the stand-ins: the graph under construction, sizes, tensors;
- materialise: stand-ins built as graph tensors when a use needs one;
- rules: the op rules of torch functions, Tensor methods and operators
  (installed into values, whose operators call them);
- patches: torch.arange, the factories and torch.distributed, replaced
  while a function is traced;
- collectives: dloss.all_gather, all_reduce, reduce_scatter, broadcast,
  ring_shift and the rank facts;
- record: runs the function and ends the graph (trace_graph).

Each module that emits ops names them in EMITS; emitted_ops() is their
union, kept true by test/python/test_trace_emits.py.
"""

from . import collectives, materialise, rules, values
from .collectives import (all_gather, all_reduce, broadcast, global_size,
                          rank, reduce_scatter, ring_shift, shard_offset,
                          world_size)
from .locations import fail
from .record import trace_graph
from .values import FLOAT_DTYPES

__all__ = ["FLOAT_DTYPES", "all_gather", "all_reduce", "broadcast",
           "emitted_ops", "fail", "global_size", "rank", "reduce_scatter",
           "ring_shift", "shard_offset", "trace_graph", "world_size"]


def emitted_ops():
    """The names of the dloss ops ("dloss.add", ...) that tracing a loss
    can emit: what each rule module declares in EMITS."""
    return sorted(values.EMITS | materialise.EMITS | rules.EMITS |
                  collectives.EMITS)
