/* libdloss_compiler: the dloss compiler (MLIR and LLVM linked in statically,
 * their symbols hidden) behind a small C API, as IREE ships its compiler
 * (libIREECompiler.so). It holds no torch and no Python, so one build serves
 * every torch and Python version; the C++ JIT and the Python package load it
 * with dlopen when they first compile (frontend/CompilerLibrary.h), and run
 * cached plans without it.
 *
 * Two halves:
 * - compiling: dloss MLIR text and options in, plan bytes (the runtime's
 *   FlatBuffers plan) and structured diagnostics out;
 * - building: the ops of a dloss::Graph (frontend/Graph.h), one call per op,
 *   each checked as it is added, and the graph's MLIR text out.
 *
 * Strings passed in are copied; strings and buffers returned stay valid until
 * the next call on the same object or its destruction. Not thread-safe per
 * object; distinct objects may be used from distinct threads. */
#ifndef DLOSS_COMPILER_H
#define DLOSS_COMPILER_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define DLOSS_COMPILER_API __attribute__((visibility("default")))
#else
#define DLOSS_COMPILER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a declaration below changes; the loader refuses another. */
#define DLOSS_COMPILER_API_VERSION 1

DLOSS_COMPILER_API int32_t dloss_compiler_api_version(void);
/* The SHA-256 of the compiler's sources this library was built from (the
 * plan cache key's compiler part, runtime/plan/PlanCache.h). */
DLOSS_COMPILER_API const char *dloss_compiler_identity(void);

/*===------------------------------------------------------------------===*
 * Compiling
 *===------------------------------------------------------------------===*/

typedef struct dloss_compile_request {
  const char *source; /* dloss MLIR text (need not end in NUL) */
  size_t source_size;
  const char *name;      /* the buffer's name in diagnostics ("clip.mlir") */
  const char *grad_mode; /* "ddp", "global", or "" to keep the source's */
  int32_t fuse;          /* 0: no fusion (dlossc --no-fuse) */
  int32_t general_only;  /* 1: only the general fused op
                            (dlossc --general-fusion-only) */
} dloss_compile_request;

enum dloss_severity {
  DLOSS_SEVERITY_ERROR = 0,
  DLOSS_SEVERITY_WARNING = 1,
  DLOSS_SEVERITY_REMARK = 2,
  DLOSS_SEVERITY_NOTE = 3
};

typedef struct dloss_diagnostic {
  int32_t severity; /* enum dloss_severity */
  const char *file; /* "" when the location has none */
  int32_t line;     /* 0 when unknown */
  int32_t column;
  const char *message;
} dloss_diagnostic;

typedef struct dloss_compile_result dloss_compile_result;

/* Never null; free it with dloss_compile_result_free. */
DLOSS_COMPILER_API dloss_compile_result *
dloss_compile(const dloss_compile_request *request);
DLOSS_COMPILER_API void dloss_compile_result_free(dloss_compile_result *);
/* 1 when the plan was produced. */
DLOSS_COMPILER_API int32_t dloss_compile_ok(const dloss_compile_result *);
DLOSS_COMPILER_API const uint8_t *
dloss_compile_plan(const dloss_compile_result *, size_t *size);
DLOSS_COMPILER_API size_t
dloss_compile_diagnostic_count(const dloss_compile_result *);
/* Diagnostic `index` (< dloss_compile_diagnostic_count); an empty note
 * past the end. */
DLOSS_COMPILER_API dloss_diagnostic
dloss_compile_diagnostic(const dloss_compile_result *, size_t index);
/* Every diagnostic as MLIR prints them ("clip.mlir:3:8: error: ..." with the
 * source line), for messages. */
DLOSS_COMPILER_API const char *
dloss_compile_messages(const dloss_compile_result *);

/*===------------------------------------------------------------------===*
 * Building a graph
 *===------------------------------------------------------------------===*/

typedef struct dloss_graph dloss_graph;

/* One op of dloss::Graph (its method `method`: "matmul", "input", ...) with
 * its operands in order by kind. Enumerations travel as their values in
 * frontend/Graph.h and runtime/comm/Reduction.h; an absent optional size is
 * -1. */
typedef struct dloss_graph_call {
  const char *method;
  const int32_t *tensors;
  int32_t tensor_count;
  const int32_t *sizes;
  int32_t size_count;
  const int64_t *ints;
  int32_t int_count;
  const double *reals;
  int32_t real_count;
  const char *text; /* an input's name */
  const char *file; /* the user's call site */
  int32_t line;
} dloss_graph_call;

/* What went wrong in dloss_graph_add: the problem, what to do, the op and
 * the user's "file:line". */
typedef struct dloss_graph_error {
  const char *message;
  const char *hint;
  const char *op;
  const char *location;
} dloss_graph_error;

DLOSS_COMPILER_API dloss_graph *dloss_graph_create(const char *name);
DLOSS_COMPILER_API void dloss_graph_destroy(dloss_graph *);
/* Adds the op: the id of its result (a tensor or a size, by method; 0 for
 * setLoss), or -1 with *error filled in and the graph unchanged. */
DLOSS_COMPILER_API int32_t dloss_graph_add(dloss_graph *,
                                           const dloss_graph_call *call,
                                           dloss_graph_error *error);
/* Tensor `id`'s rank, its sizes in dims[0..min(rank, capacity)) (-1 where
 * known only at run time); -1 for an unknown id. */
DLOSS_COMPILER_API int32_t dloss_graph_shape(dloss_graph *, int32_t id,
                                             int64_t *dims, int32_t capacity);
/* The verified program as MLIR text (after setLoss). */
DLOSS_COMPILER_API const char *dloss_graph_mlir(dloss_graph *);

#ifdef __cplusplus
}
#endif

#endif /* DLOSS_COMPILER_H */
