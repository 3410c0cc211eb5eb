// How communicator errors name a call, a duration and a foreign exception.
#include "runtime/comm/Call.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace dloss::comm {

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

// c10::Error::what() appends a C++ backtrace; users need the message only.
// This reads the same in LibTorch 1.13 and 2.x.
std::string describeError(const std::exception &e) {
  std::string text;
  if (const auto *c10Error = dynamic_cast<const c10::Error *>(&e))
    text = c10Error->what_without_backtrace();
  else
    text = e.what();
  // Keep the first line: later lines are backtraces or debug dumps.
  auto newline = text.find('\n');
  if (newline != std::string::npos)
    text.resize(newline);
  // Gloo prefixes its source position ("[../gloo/transport/tcp/pair.cc:598]
  // Connection closed by peer"), which tells users nothing.
  if (!text.empty() && text.front() == '[') {
    auto close = text.find("] ");
    if (close != std::string::npos)
      text.erase(0, close + 2);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '.'))
    text.pop_back();
  if (text.size() > 400)
    text = text.substr(0, 400) + "...";
  return text.empty() ? std::string("unknown c10d error") : text;
}

int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// " (dloss.all_gather at clip.mlir:12:16 in @clip_grad)", or the phase.
std::string siteText(const CallSite &site) {
  std::string out;
  if (!site.op.empty())
    out = site.op + (site.location.empty() ? "" : " at " + site.location);
  else if (!site.phase.empty())
    out = site.phase;
  if (!site.function.empty())
    out += (out.empty() ? "in @" : " of @") + site.function;
  return out.empty() ? "" : " (" + out + ")";
}

Call::Call(std::string name, std::string irOp)
    : name(std::move(name)), irOp(std::move(irOp)) {
  if (const CallSite *current = currentCallSite())
    site = *current;
}

std::string Call::describe() const {
  std::string out =
      seq >= 0 ? "collective #" + std::to_string(seq) + " " + name : name;
  if (!site.phase.empty())
    out += " (" + site.phase +
           (site.function.empty() ? "" : " of @" + site.function) + ")";
  else if (!site.function.empty())
    out += " (in @" + site.function + ")";
  return out;
}

} // namespace dloss::comm
