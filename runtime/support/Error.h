// dloss::Error: the one exception type of the runtime, with what went wrong,
// where, and what to do.
#ifndef DLOSS_RUNTIME_ERROR_H
#define DLOSS_RUNTIME_ERROR_H

#include <optional>
#include <stdexcept>
#include <string>

namespace dloss {

/// The structured fields of an Error. Empty strings mean "absent", so the
/// aggregate can be filled positionally or field by field:
///   ErrorInfo info; info.problem = "..."; info.hint = "..."; throw
///   Error(info);
struct ErrorInfo {
  /// What went wrong, as one sentence ("input 'x' has 3 dims, expected 2").
  std::string problem;
  /// What the user should do about it, a capitalised sentence ("Pass a
  /// [batch, dim] tensor").
  std::string hint;
  /// The rank that raised the error, when known.
  std::optional<int> rank;
  /// The plan or IR op being executed ("dloss.all_gather").
  std::string op;
  /// The IR location of that op ("clip.mlir:12:8").
  std::string location;
};

/// The exception every runtime failure is reported with. what() renders all
/// present fields into one line:
///   dloss error [rank 2, op dloss.all_gather at clip.mlir:12:8]: <problem>.
///   <hint>.
/// Errors are immutable, so what() always matches the fields; the with*()
/// methods return an amended copy, which lets a caller add context while the
/// error travels up:
///   throw Error("shard sizes differ", "Pad the last batch")
///       .withOp("dloss.all_gather");
///   ...
///   catch (const Error &e) { throw e.withRank(rank); }
/// A hint is a full sentence, capitalised; what() ends each part with a
/// period when it has none.
class Error : public std::runtime_error {
public:
  explicit Error(ErrorInfo fields);
  explicit Error(std::string problem, std::string hint = {});

  /// Copies of this error with one field replaced.
  Error withRank(int rank) const;
  Error withOp(std::string op) const;
  Error withLocation(std::string location) const;
  Error withHint(std::string hint) const;

  /// What went wrong, without decoration (what() is the rendered message).
  const std::string &problem() const { return info.problem; }
  /// What to do about it; empty when there is no advice.
  const std::string &hint() const { return info.hint; }
  const std::optional<int> &rank() const { return info.rank; }
  /// The op name; empty when unknown.
  const std::string &op() const { return info.op; }
  /// The IR location; empty when unknown.
  const std::string &location() const { return info.location; }
  const ErrorInfo &fields() const { return info; }

  /// The one-line message what() returns, rendered from the fields.
  static std::string format(const ErrorInfo &info);

private:
  ErrorInfo info;
};

/// Throws Error(problem, hint): the runtime's kernels and plan readers fail
/// through it.
[[noreturn]] void fail(std::string problem, std::string hint = {});

/// The hint of an error that only a malformed plan, or one this runtime
/// reads differently from the compiler that wrote it, can cause.
extern const char *const kPlanBugHint;

} // namespace dloss

#endif // DLOSS_RUNTIME_ERROR_H
