// dloss::Error: rendering its message, the one way the runtime raises it.
#include "runtime/support/Error.h"

#include <utility>

namespace dloss {

void fail(std::string problem, std::string hint) {
  throw Error(std::move(problem), std::move(hint));
}

const char *const kPlanBugHint =
    "The plan does not match this runtime; recompile it with dlossc, and "
    "report a bug if that does not help";

namespace {

// Appends a sentence and closes it with a period unless it already ends in
// punctuation, so callers may write problems and hints either way.
void appendSentence(std::string &out, const std::string &sentence) {
  out += sentence;
  char last = sentence.back();
  if (last != '.' && last != '!' && last != '?')
    out += '.';
}

} // namespace

std::string Error::format(const ErrorInfo &info) {
  std::string where;
  auto addPart = [&where](const std::string &part) {
    if (!where.empty())
      where += ", ";
    where += part;
  };
  if (info.rank)
    addPart("rank " + std::to_string(*info.rank));
  // The location belongs to the op, so they share one part: "op X at L".
  if (!info.op.empty() && !info.location.empty())
    addPart("op " + info.op + " at " + info.location);
  else if (!info.op.empty())
    addPart("op " + info.op);
  else if (!info.location.empty())
    addPart("at " + info.location);

  std::string message = "dloss error";
  if (!where.empty())
    message += " [" + where + "]";
  message += ": ";
  appendSentence(message,
                 info.problem.empty() ? "unknown error" : info.problem);
  if (!info.hint.empty()) {
    message += ' ';
    appendSentence(message, info.hint);
  }
  return message;
}

Error::Error(ErrorInfo fields)
    : std::runtime_error(format(fields)), info(std::move(fields)) {}

Error::Error(std::string problem, std::string hint)
    : Error(ErrorInfo{
          std::move(problem), std::move(hint), std::nullopt, {}, {}}) {}

Error Error::withRank(int rank) const {
  ErrorInfo copy = info;
  copy.rank = rank;
  return Error(std::move(copy));
}

Error Error::withOp(std::string op) const {
  ErrorInfo copy = info;
  copy.op = std::move(op);
  return Error(std::move(copy));
}

Error Error::withLocation(std::string location) const {
  ErrorInfo copy = info;
  copy.location = std::move(location);
  return Error(std::move(copy));
}

Error Error::withHint(std::string hint) const {
  ErrorInfo copy = info;
  copy.hint = std::move(hint);
  return Error(std::move(copy));
}

} // namespace dloss
