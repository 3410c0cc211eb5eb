// dloss._C: the thin pybind11 layer under `import dloss`. Tensors, process
// groups, stores and errors cross it; the logic stays in the runtime, the JIT
// and the Python package (python/dloss/).
//
// Torch's own Tensor, ProcessGroup and Store objects cross because the module
// is built with torch's bundled pybind11 and so shares its internals with
// libtorch_python: a group is looked up by its C++ type and held by a new
// reference (intrusive_ptr). `objects_cross` lets `import dloss` prove it.
// Every call that may block releases the GIL, so Python's signal handlers and
// other threads keep running while a rank waits for its peers.
#include "frontend/CompilerLibrary.h"
#include "frontend/Graph.h"
#include "frontend/Jit.h"
#include "frontend/Losses.h"
#include "runtime/autograd/CompiledLoss.h"
#include "runtime/comm/BoundedStore.h"
#include "runtime/comm/CallSite.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/GuardedBackend.h"
#include "runtime/comm/Refusal.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/kernels/OpTable.h"
#include "runtime/plan/CompilerIdentity.h"
#include "runtime/plan/PlanCache.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/plan/PlanText.h"
#include "runtime/support/Error.h"

#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>

namespace py = pybind11;
using namespace dloss;

namespace {

using GilRelease = py::call_guard<py::gil_scoped_release>;

/// dloss.Error: set from Python (dloss/errors.py) so that it is the class the
/// package exports.
PyObject *errorType = PyExc_RuntimeError;

/// `e` as a dloss.Error object: its rendered message and its fields.
py::object toPython(const Error &e) {
  py::object type = py::reinterpret_borrow<py::object>(errorType);
  py::object error = type(py::str(e.what()));
  error.attr("problem") = e.problem();
  error.attr("hint") = e.hint();
  error.attr("rank") = e.rank() ? py::object(py::int_(*e.rank())) : py::none();
  error.attr("op") = e.op();
  error.attr("location") = e.location();
  return error;
}

void raise(const Error &e) {
  py::object error = toPython(e);
  PyErr_SetObject(errorType, error.ptr());
}

RendezvousOptions deadlineOptions(double timeoutSeconds,
                                  const std::string &flightDir) {
  if (!(timeoutSeconds > 0))
    throw Error("timeout must be positive (got " +
                    std::to_string(timeoutSeconds) + " s)",
                "Pass a deadline in seconds, such as timeout=300");
  RendezvousOptions options;
  options.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(timeoutSeconds * 1000.0 + 0.5));
  options.flightDir = flightDir;
  return options;
}

/// A reference of our own to the C++ object behind a torch.distributed
/// object of class T (ProcessGroup, Store), or a clear error.
template <typename T>
c10::intrusive_ptr<T> borrowTorch(const py::handle &object, const char *what) {
  T *raw = nullptr;
  try {
    raw = object.cast<T *>();
  } catch (const py::cast_error &) {
  }
  if (!raw)
    throw Error(std::string("expected a torch.distributed ") + what + ", got " +
                    py::str(py::type::of(object)).cast<std::string>(),
                std::string("Pass the ") + what +
                    " torch.distributed gives (dist.group.WORLD or a "
                    "dist.new_group(...))");
  return c10::intrusive_ptr<T>::reclaim_copy(raw);
}

/// Runs a communicator call with `site` as its call site, so that its
/// errors say where in the user's code it was made.
template <typename Body>
auto atSite(const std::string &op, const std::string &location, Body &&body) {
  CallSite site;
  site.op = op;
  site.location = location;
  CallSiteScope scope(site);
  return body();
}

Reduction reduction(const std::string &name) {
  if (std::optional<Reduction> op = reductionFromName(name))
    return *op;
  throw Error("unknown reduction '" + name + "'",
              "Use 'sum', 'mean', 'max' or 'min'");
}

void bindCommunicator(py::module_ &m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(
      m, "Communicator",
      "The ranks of one job as dloss sees them: checked, numbered "
      "collectives with deadlines.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::worldSize)
      .def_property_readonly("collectives_started",
                             &Communicator::collectivesStarted)
      .def_property_readonly(
          "fold_capacity", &Communicator::foldCapacity,
          "The bytes of rows the next preflight can carry (docs/Fusion.md, "
          "\"The preflight carries the first gather\"), the same on every "
          "rank")
      .def(
          "all_gather",
          [](Communicator &c, const at::Tensor &x, int64_t axis,
             const std::vector<int64_t> &sizes, const std::string &op,
             const std::string &location) {
            return atSite(op, location,
                          [&] { return c.allGather(x, axis, sizes); });
          },
          py::arg("tensor"), py::arg("axis"), py::arg("sizes"),
          py::arg("op") = "dloss.all_gather", py::arg("location") = "",
          GilRelease())
      .def(
          "reduce_scatter",
          [](Communicator &c, const at::Tensor &x, const std::string &kind,
             int64_t axis, const std::vector<int64_t> &sizes,
             const std::string &op, const std::string &location) {
            return atSite(op, location, [&] {
              return c.reduceScatter(x, reduction(kind), axis, sizes);
            });
          },
          py::arg("tensor"), py::arg("kind"), py::arg("axis"), py::arg("sizes"),
          py::arg("op") = "dloss.reduce_scatter", py::arg("location") = "",
          GilRelease())
      .def(
          "all_reduce",
          [](Communicator &c, const at::Tensor &x, const std::string &kind,
             const std::string &op, const std::string &location) {
            return atSite(op, location,
                          [&] { return c.allReduce(x, reduction(kind)); });
          },
          py::arg("tensor"), py::arg("kind") = "sum",
          py::arg("op") = "dloss.all_reduce", py::arg("location") = "",
          GilRelease())
      .def(
          "all_gather_ints",
          [](Communicator &c, const std::vector<int64_t> &values,
             const std::string &op, const std::string &location) {
            return atSite(op, location,
                          [&] { return c.allGatherInts(values); });
          },
          py::arg("values"), py::arg("op") = "", py::arg("location") = "",
          GilRelease())
      .def("note_failure", &Communicator::noteFailure, py::arg("message"))
      .def("record_exit", &Communicator::recordExit, py::arg("reason"),
           py::arg("raised"), GilRelease())
      .def("keep_store_for_peers", &Communicator::keepStoreForPeers,
           GilRelease())
      .def(
          "peer_exits",
          [](Communicator &c) {
            std::vector<std::tuple<int, int64_t, std::string, bool>> out;
            for (const Communicator::PeerExit &e : c.peerExits())
              out.emplace_back(e.rank, e.unixMs, e.reason, e.afterFailure);
            return out;
          },
          GilRelease(),
          "Every rank's exit record, earliest first: (rank, unix_ms, "
          "reason, after_failure).")
      .def("root_cause", &Communicator::rootCause, GilRelease());

  m.def(
      "process_group_communicator",
      [](const py::object &group, const py::object &store,
         double timeoutSeconds, const std::string &flightDir,
         const std::string &masterAddr, int masterPort) {
        auto pg = borrowTorch<c10d::ProcessGroup>(group, "ProcessGroup");
        c10::intrusive_ptr<c10d::Store> s;
        if (!store.is_none())
          s = borrowTorch<c10d::Store>(store, "Store");
        RendezvousOptions options = deadlineOptions(timeoutSeconds, flightDir);
        options.masterAddr = masterAddr;
        options.masterPort = masterPort;
        py::gil_scoped_release release;
        return std::shared_ptr<Communicator>(
            makeProcessGroupCommunicator(options, std::move(s), std::move(pg)));
      },
      py::arg("group"), py::arg("store"), py::arg("timeout"),
      py::arg("flight_dir") = "", py::arg("master_addr") = "",
      py::arg("master_port") = 0,
      "A Communicator over a torch.distributed ProcessGroup (and its "
      "store, where each rank records its latest collective).");
  m.def(
      "single_process_communicator",
      [] {
        return std::shared_ptr<Communicator>(makeSingleProcessCommunicator());
      },
      "The communicator of one process (every collective is the identity).");
}

void bindGraph(py::module_ &m) {
  py::enum_<DType>(m, "DType")
      .value("f16", DType::F16)
      .value("bf16", DType::BF16)
      .value("f32", DType::F32)
      .value("f64", DType::F64)
      .value("i32", DType::I32)
      .value("i64", DType::I64);
  py::enum_<GatherGrad>(m, "GatherGrad")
      .value("exact", GatherGrad::Exact)
      .value("local", GatherGrad::Local)
      .value("none", GatherGrad::None);
  py::enum_<GradMode>(m, "GradMode")
      .value("ddp", GradMode::Ddp)
      .value("global_", GradMode::Global);

  py::class_<Size>(m, "Size", "A symbolic size: a dimension, an offset.");
  py::class_<Tensor>(m, "Tensor", "A symbolic tensor of a dloss.Graph.")
      .def_property_readonly("shape", &Tensor::shape)
      .def("__add__", [](Tensor a, Tensor b) { return a + b; })
      .def("__add__", [](Tensor a, double b) { return a + b; })
      .def("__radd__", [](Tensor a, double b) { return a + b; })
      .def("__sub__", [](Tensor a, Tensor b) { return a - b; })
      .def("__sub__", [](Tensor a, double b) { return a - b; })
      .def("__rsub__", [](Tensor a, double b) { return -a + b; })
      .def("__mul__", [](Tensor a, Tensor b) { return a * b; })
      .def("__mul__", [](Tensor a, double b) { return a * b; })
      .def("__rmul__", [](Tensor a, double b) { return b * a; })
      .def("__truediv__", [](Tensor a, Tensor b) { return a / b; })
      .def("__truediv__", [](Tensor a, double b) { return a / b; })
      .def("__neg__", [](Tensor a) { return -a; });

  // Errors point at the Python line that built the op (dloss/graph.py
  // passes it as `at`).
  using G = Graph;
  auto at = [](const std::string &file, int line) {
    // SourceLoc keeps a pointer: intern the file names.
    static std::vector<std::unique_ptr<std::string>> files;
    for (auto &f : files)
      if (*f == file)
        return SourceLoc{f->c_str(), line};
    files.push_back(std::make_unique<std::string>(file));
    return SourceLoc{files.back()->c_str(), line};
  };
  py::class_<Graph>(m, "Graph")
      .def(py::init<std::string>(), py::arg("name") = "loss")
      .def_property_readonly("name", &G::name)
      .def("input_names", &G::inputNames)
      .def("to_mlir", &G::toMlir)
      .def(
          "input",
          [at](G &g, const std::string &name, DType dtype,
               std::vector<int64_t> shape, bool grad, bool replicated,
               const std::string &file, int line, bool state) {
            return g.input(name, dtype, std::move(shape),
                           {grad, replicated, state}, at(file, line));
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("grad"),
          py::arg("replicated"), py::arg("file"), py::arg("line"),
          py::arg("state") = false, py::keep_alive<0, 1>())
      .def(
          "all_gather",
          [at](G &g, Tensor x, int64_t axis, GatherGrad grad,
               const std::string &file,
               int line) { return g.allGather(x, axis, grad, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "all_reduce",
          [at](G &g, Tensor x, const std::string &kind, const std::string &file,
               int line) {
            return g.allReduce(x, reduction(kind), at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "reduce_scatter",
          [at](G &g, Tensor x, const std::string &kind, int64_t axis,
               std::optional<Size> size, const std::string &file, int line) {
            return g.reduceScatter(x, reduction(kind), axis, size,
                                   at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "broadcast",
          [at](G &g, Tensor x, int64_t root, const std::string &file,
               int line) { return g.broadcast(x, root, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "ring_shift",
          [at](G &g, Tensor x, int64_t shift, const std::string &file,
               int line) { return g.ringShift(x, shift, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "rank",
          [at](G &g, const std::string &file, int line) {
            return g.rank(at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "world_size",
          [at](G &g, const std::string &file, int line) {
            return g.worldSize(at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "dim",
          [at](G &g, Tensor x, int64_t axis, const std::string &file,
               int line) { return g.dim(x, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "shard_offset",
          [at](G &g, Tensor x, int64_t axis, const std::string &file,
               int line) { return g.shardOffset(x, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "global_size",
          [at](G &g, Tensor x, int64_t axis, const std::string &file,
               int line) { return g.globalSize(x, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "size",
          [at](G &g, int64_t value, const std::string &file, int line) {
            return g.size(value, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "size_arith",
          [at](G &g, const std::string &op, Size a, Size b,
               const std::string &file, int line) {
            SourceLoc loc = at(file, line);
            if (op == "add")
              return g.addSizes(a, b, loc);
            if (op == "sub")
              return g.subSizes(a, b, loc);
            if (op == "mul")
              return g.mulSizes(a, b, loc);
            throw Error("unknown size op '" + op + "'", "Use add, sub or mul");
          },
          py::keep_alive<0, 1>())
      .def(
          "select",
          [at](G &g, Tensor cond, Tensor a, Tensor b, const std::string &file,
               int line) { return g.select(cond, a, b, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "constant",
          [at](G &g, double value, DType dtype, const std::string &file,
               int line) { return g.constant(value, dtype, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "matmul",
          [at](G &g, Tensor a, Tensor b, bool ta, bool tb,
               const std::string &file,
               int line) { return g.matmul(a, b, ta, tb, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "binary",
          [at](G &g, const std::string &op, Tensor a, Tensor b,
               const std::string &file, int line) {
            SourceLoc loc = at(file, line);
            if (op == "add")
              return g.add(a, b, loc);
            if (op == "sub")
              return g.sub(a, b, loc);
            if (op == "mul")
              return g.mul(a, b, loc);
            if (op == "div")
              return g.div(a, b, loc);
            if (op == "eq")
              return g.eq(a, b, loc);
            throw Error("unknown binary op '" + op + "'",
                        "Use add, sub, mul, div or eq");
          },
          py::keep_alive<0, 1>())
      .def(
          "unary",
          [at](G &g, const std::string &op, Tensor x, const std::string &file,
               int line) {
            SourceLoc loc = at(file, line);
            if (op == "neg")
              return g.neg(x, loc);
            if (op == "exp")
              return g.exp(x, loc);
            if (op == "log")
              return g.log(x, loc);
            if (op == "softplus")
              return g.softplus(x, loc);
            if (op == "log_sigmoid")
              return g.logSigmoid(x, loc);
            if (op == "sigmoid")
              return g.sigmoid(x, loc);
            if (op == "cos")
              return g.cos(x, loc);
            if (op == "sin")
              return g.sin(x, loc);
            if (op == "acos")
              return g.acos(x, loc);
            if (op == "sqrt")
              return g.sqrt(x, loc);
            if (op == "stop_gradient")
              return g.stopGradient(x, loc);
            if (op == "zeros_like")
              return g.zerosLike(x, loc);
            throw Error("unknown unary op '" + op + "'",
                        "See dloss.Graph's methods for the ops there are");
          },
          py::keep_alive<0, 1>())
      .def(
          "clamp",
          [at](G &g, Tensor x, std::optional<double> lo,
               std::optional<double> hi, const std::string &file,
               int line) { return g.clamp(x, lo, hi, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "cast",
          [at](G &g, Tensor x, DType dtype, const std::string &file, int line) {
            return g.cast(x, dtype, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "to_tensor",
          [at](G &g, Size n, DType dtype, const std::string &file, int line) {
            return g.toTensor(n, dtype, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "l2_normalize",
          [at](G &g, Tensor x, int64_t axis, double eps,
               const std::string &file, int line) {
            return g.l2Normalize(x, axis, eps, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "reduce",
          [at](G &g, Tensor x, const std::string &kind,
               std::vector<int64_t> axes, const std::string &file, int line) {
            return g.reduce(x, reduction(kind), std::move(axes),
                            at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "logsumexp",
          [at](G &g, Tensor x, int64_t axis, const std::string &file,
               int line) { return g.logsumexp(x, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "take_along",
          [at](G &g, Tensor x, Tensor i, int64_t axis, const std::string &file,
               int line) { return g.takeAlong(x, i, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "put_along",
          [at](G &g, Tensor x, Tensor i, Tensor v, int64_t axis,
               const std::string &file,
               int line) { return g.putAlong(x, i, v, axis, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "arange",
          [at](G &g, Size start, Size count, DType dtype,
               const std::string &file, int line) {
            return g.arange(start, count, dtype, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "cross_entropy",
          [at](G &g, Tensor logits, Tensor targets, int64_t axis,
               const std::string &file, int line) {
            return g.crossEntropy(logits, targets, axis, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "expand",
          [at](G &g, Tensor x, std::vector<int64_t> axes, Tensor like,
               const std::string &file, int line) {
            return g.expand(x, std::move(axes), like, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "slice",
          [at](G &g, Tensor x, int64_t axis, Size offset, Size size,
               const std::string &file, int line) {
            return g.slice(x, axis, offset, size, at(file, line));
          },
          py::keep_alive<0, 1>())
      .def(
          "pad",
          [at](G &g, Tensor x, int64_t axis, Size low, Size high,
               const std::string &file,
               int line) { return g.pad(x, axis, low, high, at(file, line)); },
          py::keep_alive<0, 1>())
      .def(
          "set_loss",
          [at](G &g, Tensor loss, GradMode mode, const std::string &file,
               int line, std::vector<Tensor> state) {
            g.setLoss(loss, std::move(state), mode, at(file, line));
          },
          py::arg("loss"), py::arg("mode"), py::arg("file"), py::arg("line"),
          py::arg("state") = std::vector<Tensor>{});
}

void bindLosses(py::module_ &m) {
  m.def(
      "clip_graph",
      [](int64_t dim, DType dtype, GradMode mode) {
        return losses::clip({dim, dtype, mode});
      },
      py::arg("dim") = -1, py::arg("dtype") = DType::F32,
      py::arg("mode") = GradMode::Ddp);
  m.def(
      "siglip_graph",
      [](int64_t dim, DType dtype, GradMode mode) {
        return losses::siglip({dim, dtype, mode});
      },
      py::arg("dim") = -1, py::arg("dtype") = DType::F32,
      py::arg("mode") = GradMode::Ddp);
  m.def(
      "margin_graph",
      [](const std::string &kind, int64_t dim, int64_t classes, double scale,
         double margin, DType dtype, GradMode mode, bool sharded,
         bool pmlBeyondPiMinusMargin) {
        losses::MarginOptions o;
        if (kind == "arcface")
          o.kind = losses::MarginOptions::ArcFace;
        else if (kind == "cosface")
          o.kind = losses::MarginOptions::CosFace;
        else
          throw Error("unknown margin loss '" + kind + "'",
                      "Use 'arcface' or 'cosface'");
        o.dim = dim;
        o.classes = classes;
        o.scale = scale;
        o.margin = margin;
        o.dtype = dtype;
        o.mode = mode;
        o.shardedClasses = sharded;
        o.pmlBeyondPiMinusMargin = pmlBeyondPiMinusMargin;
        return losses::margin(o);
      },
      py::arg("kind"), py::arg("dim") = -1, py::arg("classes") = -1,
      py::arg("scale") = 64.0, py::arg("margin") = 0.5,
      py::arg("dtype") = DType::F32, py::arg("mode") = GradMode::Ddp,
      py::arg("sharded") = false,
      py::arg("pml_beyond_pi_minus_margin") = false);
}

void bindJit(py::module_ &m) {
  py::class_<PlanFile, std::shared_ptr<PlanFile>>(m, "Plan", "A compiled plan.")
      .def_property_readonly("name", &PlanFile::name)
      .def(
          "text", [](const PlanFile &p) { return plan::toText(p.plan()); },
          "The plan as text, one line per step (as dlossc --emit=plan-text).")
      .def(
          "fused_ops",
          [](const PlanFile &p) {
            std::set<std::string> fused;
            for (const plan::Function *function : *p.plan().functions())
              if (function->steps())
                for (const plan::Step *step : *function->steps()) {
                  const OpSpec *spec = findOpSpec(step->op()->str());
                  if (spec && spec->fused)
                    fused.insert(spec->name);
                }
            return std::vector<std::string>(fused.begin(), fused.end());
          },
          "The fused ring-tiled ops (Dloss_Fused in the op table) that the "
          "plan's steps run, sorted by name.");
  m.def(
      "op_table",
      [] {
        py::list ops;
        for (const OpSpec &spec : opSpecs()) {
          py::dict op;
          op["name"] = spec.name;
          op["collective"] = spec.collective;
          op["internal"] = spec.internal;
          op["fused"] = spec.fused;
          op["index"] = spec.index.present()
                            ? py::object(py::make_tuple(spec.index.data,
                                                        spec.index.indices))
                            : py::none();
          ops.append(op);
        }
        return ops;
      },
      "Every op a plan may hold, from its ODS definition (the runtime's op "
      "table): name, collective, internal (users never build it), fused (a "
      "ring-tiled op), index ((data, indices) operands, or None).");
  m.def(
      "compile_plan",
      [](const std::string &text, const std::string &gradMode,
         const std::string &name, bool fuse) {
        return std::const_pointer_cast<PlanFile>(
            jit::compilePlan(text, gradMode, name, fuse));
      },
      py::arg("text"), py::arg("grad_mode") = "", py::arg("name") = "<python>",
      py::arg("fuse") = true, GilRelease());
  m.def(
      "compile_graph_plan",
      [](const Graph &graph, const std::string &gradMode, bool fuse) {
        return std::const_pointer_cast<PlanFile>(
            jit::compilePlan(graph, gradMode, fuse));
      },
      py::arg("graph"), py::arg("grad_mode") = "", py::arg("fuse") = true,
      GilRelease(),
      "The plan of a Graph, cached under its recording (one line per op), so "
      "that it runs where the compiler library is missing once compiled "
      "elsewhere.");
  m.def(
      "load_plan",
      [](const std::string &path) {
        return std::const_pointer_cast<PlanFile>(PlanFile::load(path));
      },
      py::arg("path"));
  m.attr("compiler_identity") = kCompilerIdentity;
  // dloss-compiler's version label (cmake/DlossCompilerIdentity.cmake).
  m.attr("compiler_label") = kCompilerLabel;
  m.def("compiler_library_path", &compilerLibraryPath,
        "The compiler library dloss loads when it compiles: "
        "DLOSS_COMPILER_LIBRARY, the one beside the JIT, or the "
        "dloss-compiler wheel's (frontend/CompilerLibrary.cpp).");
  m.def("cached_plans", &jit::cachedPlans);
  m.def(
      "set_schedule",
      [](const std::string &schedule) {
        fused::setDefaultSchedule(fused::parseSchedule(schedule, "schedule"));
      },
      py::arg("schedule"),
      "Sets the process's default schedule of the fused ops: \"auto\", "
      "\"ring\" or \"gather\".");
  m.def(
      "get_schedule",
      [] { return std::string(fused::scheduleName(fused::defaultSchedule())); },
      "The process's default schedule of the fused ops.");
  m.def(
      "fused_passes",
      [] {
        fused::PassCounts counts = fused::passCounts();
        return std::map<std::string, int64_t>{{"ring", counts.ring},
                                              {"gather", counts.gather},
                                              {"kept", counts.kept}};
      },
      "How many fused passes (a fused op's forward or backward) this "
      "process ran as the ring and as the gather: which schedule ran; and "
      "how many backward passes read the similarity their forward kept "
      "(\"kept\").");
  m.def(
      "gather_crossover_bytes",
      [](int worldSize, const std::string &device) {
        return fused::gatherCrossoverBytes(worldSize,
                                           c10::Device(device).type());
      },
      py::arg("world_size"), py::arg("device") = "cpu",
      "The global operand size (bytes of every rank's travelling features) "
      "up to which schedule \"auto\" gathers instead of running the ring.");
  m.def("clear_plan_cache", &jit::clearPlanCache);
  m.def(
      "plan_cache_stats",
      [] {
        PlanCacheStats stats = planCacheStats();
        py::dict d;
        d["compiled"] = jit::plansCompiled();
        d["disk_hits"] = stats.hits;
        d["disk_misses"] = stats.misses;
        d["corrupt"] = stats.corrupt;
        d["stored"] = stats.stored;
        std::optional<std::string> dir = planCacheDirectory();
        d["directory"] = dir ? py::object(py::str(*dir)) : py::none();
        return d;
      },
      "This process's plan cache counts: plans compiled, read from disk, "
      "missing there, rejected as corrupt, and written; and the directory.");
  m.def(
      "plan_cache_key",
      [](const std::string &text, const std::string &gradMode,
         const std::string &name, bool fuse) {
        return planCacheKey(PlanRequest{text, name, gradMode, fuse});
      },
      py::arg("text"), py::arg("grad_mode") = "", py::arg("name") = "<python>",
      py::arg("fuse") = true,
      "The plan cache key (the entry's file name without .plan) of a loss.");

  py::class_<CompiledLoss>(m, "CompiledLoss")
      .def(py::init([](std::shared_ptr<PlanFile> plan,
                       std::shared_ptr<Communicator> comm,
                       const std::string &entry, const std::string &schedule) {
             return CompiledLoss(
                 plan, std::move(comm), entry,
                 fused::parseOptionalSchedule(schedule, "schedule"));
           }),
           py::arg("plan"), py::arg("communicator"), py::arg("entry") = "",
           py::arg("schedule") = "")
      .def("__call__", &CompiledLoss::operator(), py::arg("inputs"),
           GilRelease())
      .def(
          "run",
          [](CompiledLoss &loss, const std::vector<at::Tensor> &inputs,
             const std::vector<bool> &requiresGrad, const std::string &site) {
            CallerScope caller(site);
            return loss.run(inputs, requiresGrad);
          },
          py::arg("inputs"), py::arg("requires_grad"), py::arg("site") = "",
          GilRelease(),
          "The call without autograd: [loss, one new value per "
          "state_argument_indices entry] and, when a flag is true, one "
          "gradient per grad_argument_indices entry after them. `site`: "
          "the user's file:line of the call, which peers, errors and "
          "flight records name for steps located in dloss's own sources.")
      .def_property_readonly("grad_argument_indices",
                             &CompiledLoss::gradArgumentIndices)
      .def_property_readonly("state_argument_indices",
                             &CompiledLoss::stateArgumentIndices)
      .def_property_readonly("result_dtypes", &CompiledLoss::resultTypes)
      .def_property_readonly("argument_names", &CompiledLoss::argumentNames)
      .def_property_readonly("loss_name", &CompiledLoss::lossName)
      .def_property_readonly("grad_mode", &CompiledLoss::gradMode);
}

/// dloss.guard's hooks: each calls a method of `checker` (a
/// dloss.guard._Checker) with the GIL, on the op's own thread, and only on
/// a slow path (GuardedBackend.h). Its dloss.Error crosses c10d and the
/// autograd engine as a py::error_already_set, which torch's bindings raise
/// as it is.
comm::GuardHooks pythonHooks(const py::object &checker) {
  // Released with the GIL, wherever the last hook goes (a group may end on
  // a thread of c10d's); leaked if Python has already finalised.
  std::shared_ptr<py::object> held(new py::object(checker), [](py::object *o) {
    if (!Py_IsInitialized())
      return;
    py::gil_scoped_acquire gil;
    delete o;
  });
  comm::GuardHooks hooks;
  hooks.waiting = [held](int64_t seq, const std::string &call, bool first) {
    py::gil_scoped_acquire gil;
    held->attr("waiting")(seq, call, first);
  };
  hooks.passed = [held](int64_t seq) {
    py::gil_scoped_acquire gil;
    held->attr("passed")(seq);
  };
  hooks.timedOut = [held](int64_t seq, const std::string &call) {
    py::gil_scoped_acquire gil;
    held->attr("timed_out")(seq, call);
  };
  hooks.disagreed = [held](int64_t seq, const std::string &call) {
    py::gil_scoped_acquire gil;
    held->attr("disagreed")(seq, call);
  };
  hooks.refused = [held](const std::string &call) {
    py::gil_scoped_acquire gil;
    held->attr("refused")(call);
  };
  hooks.post = [held](const std::string &call, int peer, bool send,
                      int tag) -> int64_t {
    py::gil_scoped_acquire gil;
    return held->attr("post")(call, peer, send, tag).cast<int64_t>();
  };
  hooks.verify = [held](int64_t token) {
    py::gil_scoped_acquire gil;
    held->attr("verify")(token);
  };
  return hooks;
}

void bindGuard(py::module_ &m) {
  m.def(
      "guard_group",
      [](const py::object &group, const py::object &checker,
         const py::object &side, double deadline, double poll, bool broken) {
        auto pg = borrowTorch<c10d::ProcessGroup>(group, "ProcessGroup");
        auto config = std::make_shared<comm::GuardConfig>();
        config->hooks = pythonHooks(checker);
        config->side = borrowTorch<c10d::Backend>(side, "Backend");
        auto ms = [](double seconds) {
          return std::chrono::milliseconds(
              static_cast<int64_t>(seconds * 1000.0));
        };
        config->deadline = ms(deadline);
        config->poll = ms(poll);
        config->broken = broken;
        comm::guardGroup(*pg, std::move(config));
      },
      py::arg("group"), py::arg("checker"), py::arg("side"),
      py::arg("deadline"), py::arg("poll"), py::arg("broken") = false,
      "Registers on `group`, in place of its backends, one that checks each "
      "op's fingerprint against every rank's over `side` (a Gloo backend "
      "over the group's ranks) within `deadline` seconds, and calls "
      "`checker`'s methods on the slow paths: waiting(seq, call, first) "
      "every `poll` seconds of a wait, passed(seq), timed_out(seq, call), "
      "disagreed(seq, call), refused(call), post(call, peer, send, tag) and "
      "verify(token) (runtime/comm/GuardedBackend.h). `broken`: refused "
      "already, every op calls refused(call).");
  m.def(
      "unguard_group",
      [](const py::object &group) {
        auto pg = borrowTorch<c10d::ProcessGroup>(group, "ProcessGroup");
        return comm::unguardGroup(*pg);
      },
      py::arg("group"),
      "Gives `group` its own backends back; False when it was not guarded.");
  m.def("set_guard_origin", &comm::setOriginOfThread, py::arg("origin"),
        "Makes `origin` (\"module 'encoder.0' (Linear)\") the FSDP2 owner "
        "that dloss.guard names for this thread's ops, until it is set "
        "again (\"\": none); returns the previous one.");
  m.def("guard_fingerprint", &comm::fingerprint, py::arg("call"),
        "The 62-bit fingerprint dloss.guard exchanges for an op "
        "described as `call`.");
}

/// Seconds as the milliseconds the runtime counts in, or a clear error.
std::chrono::milliseconds storeSeconds(double seconds, const char *what) {
  if (!(seconds > 0))
    throw Error(std::string("BoundedStore: ") + what +
                    " must be a positive number of seconds, got " +
                    std::to_string(seconds),
                "Pass seconds, such as 30");
  return std::chrono::milliseconds(
      static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

void bindBoundedStore(py::module_ &m) {
  using comm::BoundedStore;
  // The builtin classes, so that callers need no torch or dloss class to
  // tell a wait that ran out from a store that is gone.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const comm::StoreTimeout &e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const comm::StoreLost &e) {
      PyErr_SetString(PyExc_ConnectionError, e.what());
    }
  });
  // Every method waits on the store's worker with the GIL released; values
  // become bytes once it is held again.
  py::class_<BoundedStore, std::shared_ptr<BoundedStore>>(
      m, "BoundedStore",
      "A connection to a torch.distributed Store whose every operation ends "
      "within the deadline plus a margin (max(2 s, half of it)), or within a "
      "wait's own timeout plus that margin (runtime/comm/BoundedStore.h). "
      "A wait that runs out raises TimeoutError; any other failure (the "
      "store's host gone, broken pipe, connection reset, no answer in time) "
      "raises ConnectionError with the first failure's reason, and so does "
      "every later operation.")
      .def(py::init(
               [](const py::object &store, double deadlineSeconds, bool clone) {
                 auto s = borrowTorch<c10d::Store>(store, "Store");
                 std::chrono::milliseconds deadline =
                     storeSeconds(deadlineSeconds, "deadline_seconds");
                 return BoundedStore::over(std::move(s), clone, deadline,
                                           "the store");
               }),
           py::arg("store"), py::arg("deadline_seconds"),
           py::arg("clone") = true,
           "clone=True: a clone of `store` of its own (the caller's "
           "connection and timeout stay theirs; the deadline becomes the "
           "clone's timeout), `store` itself where it has no clone.")
      .def(
          "set_deadline",
          [](BoundedStore &s, double seconds) {
            s.setDeadline(storeSeconds(seconds, "the deadline"));
          },
          py::arg("seconds"))
      .def(
          "set",
          [](BoundedStore &s, const std::string &key,
             const std::string &value) {
            py::gil_scoped_release release;
            s.set(key, value);
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](BoundedStore &s, const std::string &key) {
            std::string value;
            {
              py::gil_scoped_release release;
              value = s.get(key);
            }
            return py::bytes(value);
          },
          py::arg("key"))
      .def(
          "check",
          [](BoundedStore &s, const std::vector<std::string> &keys) {
            py::gil_scoped_release release;
            return s.check(keys);
          },
          py::arg("keys"), "Whether every key is set.")
      .def(
          "wait",
          [](BoundedStore &s, const std::vector<std::string> &keys,
             std::chrono::duration<double> timeout) {
            std::chrono::milliseconds bound =
                storeSeconds(timeout.count(), "timeout_seconds");
            py::gil_scoped_release release;
            s.wait(keys, bound);
          },
          py::arg("keys"), py::arg("timeout_seconds"),
          "Waits until every key is set; TimeoutError after timeout_seconds "
          "(a number or a datetime.timedelta).")
      .def(
          "multi_get",
          [](BoundedStore &s, const std::vector<std::string> &keys) {
            std::vector<std::string> values;
            {
              py::gil_scoped_release release;
              values = s.multiGet(keys);
            }
            py::list out;
            for (const std::string &value : values)
              out.append(py::bytes(value));
            return out;
          },
          py::arg("keys"))
      .def(
          "compare_set",
          [](BoundedStore &s, const std::string &key,
             const std::string &expected, const std::string &desired) {
            std::string value;
            {
              py::gil_scoped_release release;
              value = s.compareSet(key, expected, desired);
            }
            return py::bytes(value);
          },
          py::arg("key"), py::arg("expected"), py::arg("desired"),
          "Sets key to desired where it holds expected (\"\": unset); "
          "returns the value it holds after.")
      .def(
          "delete_key",
          [](BoundedStore &s, const std::string &key) {
            py::gil_scoped_release release;
            return s.deleteKey(key);
          },
          py::arg("key"));
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dloss's C++ core (runtime, JIT, graph builder); use `import "
            "dloss`.";
  m.def(
      "set_error_type",
      [](const py::object &type) {
        Py_INCREF(type.ptr());
        errorType = type.ptr();
      },
      "Makes dloss errors raise `type` (dloss.Error).");
  m.def(
      "make_error",
      [](const std::string &problem, const std::string &hint,
         std::optional<int> rank, const std::string &op,
         const std::string &location) {
        ErrorInfo info;
        info.problem = problem;
        info.hint = hint;
        info.rank = rank;
        info.op = op;
        info.location = location;
        return toPython(Error(info));
      },
      py::arg("problem"), py::arg("hint") = "", py::arg("rank") = py::none(),
      py::arg("op") = "", py::arg("location") = "",
      "A dloss.Error rendered as the runtime renders its own.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const Error &e) {
      raise(e);
    }
  });
  m.def(
      "objects_cross",
      [](const py::handle &group, const py::handle &store) {
        auto pg = borrowTorch<c10d::ProcessGroup>(group, "ProcessGroup");
        auto s = borrowTorch<c10d::Store>(store, "Store");
        s->set("dloss/objects_cross", std::vector<uint8_t>{1});
        return py::make_tuple(pg->getRank(), pg->getSize(),
                              s->get("dloss/objects_cross").size());
      },
      py::arg("group"), py::arg("store"),
      "(rank, size, 1) of a torch ProcessGroup and a Store seen from C++: "
      "the import-time check that torch's objects cross into dloss.");
  m.def(
      "current_call_site",
      []() -> py::object {
        const CallSite *site = currentCallSite();
        if (!site)
          return py::none();
        return py::make_tuple(site->function, site->op, site->location,
                              site->phase);
      },
      "(function, op, location, phase) of the dloss plan step or phase this "
      "thread is running, or None outside dloss: dloss.guard tells dloss's "
      "own collectives from the user's and DDP's with it.");
  m.def("is_own_location", &isOwnLocation, py::arg("location"),
        "Whether an IR location is in dloss's own sources (a drop-in's "
        "graph) rather than the user's program.");
  m.def("add_own_source_dir", &addOwnSourceDir, py::arg("dir"),
        "Adds a directory (ending in '/') of dloss's own sources: the "
        "installed Python package.");
  m.def(
      "refuse_collective",
      [](const py::object &error) {
        comm::refuseCollective(
            ErrorInfo{error.attr("problem").cast<std::string>(),
                      error.attr("hint").cast<std::string>(),
                      error.attr("rank").cast<std::optional<int>>(),
                      error.attr("op").cast<std::string>(),
                      error.attr("location").cast<std::string>()});
      },
      py::arg("error"),
      "Leaves `error` (a dloss.Error), with which dloss.guard refuses a "
      "collective inside a dloss call on this thread: dloss raises it as it "
      "is.");
  bindCommunicator(m);
  bindGuard(m);
  bindBoundedStore(m);
  bindGraph(m);
  bindLosses(m);
  bindJit(m);
}
