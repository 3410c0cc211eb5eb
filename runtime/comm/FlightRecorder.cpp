// The flight recorder: a rank's last collectives, written as JSON when one
// fails (no c10d here).
#include "runtime/comm/FlightRecorder.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace dloss {

//===----------------------------------------------------------------------===//
// FlightRecorder
//===----------------------------------------------------------------------===//

uint64_t FlightRecorder::start(FlightEntry entry) {
  uint64_t handle = next++;
  entry.state = FlightEntry::State::Started;
  entry.startUnixMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  Slot slot{std::move(entry), handle, std::chrono::steady_clock::now()};
  size_t index = (handle - 1) % kCapacity;
  if (slots.size() <= index)
    slots.push_back(std::move(slot));
  else
    slots[index] = std::move(slot);
  return handle;
}

void FlightRecorder::finish(uint64_t handle, FlightEntry::State state,
                            const std::string &error) {
  if (handle == 0)
    return;
  size_t index = (handle - 1) % kCapacity;
  if (index >= slots.size() || slots[index].handle != handle)
    return;
  Slot &slot = slots[index];
  slot.entry.state = state;
  slot.entry.error = error;
  slot.entry.durationMs = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - slot.started)
                              .count();
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::vector<FlightEntry> out;
  if (slots.empty())
    return out;
  // The oldest entry sits right after the newest one once the ring is full.
  size_t first = slots.size() < kCapacity ? 0 : (next - 1) % kCapacity;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot &slot = slots[(first + i) % slots.size()];
    FlightEntry entry = slot.entry;
    if (entry.state == FlightEntry::State::Started)
      entry.durationMs = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - slot.started)
                             .count();
    out.push_back(std::move(entry));
  }
  return out;
}

const char *FlightRecorder::stateName(FlightEntry::State state) {
  switch (state) {
  case FlightEntry::State::Started:
    return "started";
  case FlightEntry::State::Completed:
    return "completed";
  case FlightEntry::State::Failed:
    return "failed";
  }
  return "?";
}

namespace {

std::string quote(const std::string &text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        char buffer[8];
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
        out += buffer;
      } else {
        out += static_cast<char>(c);
      }
    }
  }
  return out + "\"";
}

} // namespace

std::string FlightRecorder::toJson(const Header &header) const {
  std::ostringstream json;
  json.precision(6);
  json << std::fixed;
  int64_t nowMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  json << "{\n  \"format\": \"dloss-flight-record-v1\",\n"
       << "  \"rank\": " << header.rank << ",\n"
       << "  \"world_size\": " << header.worldSize << ",\n"
       << "  \"pid\": " << ::getpid() << ",\n"
       << "  \"written_unix_ms\": " << nowMs << ",\n"
       << "  \"deadline_s\": " << header.timeoutSeconds << ",\n"
       << "  \"error\": " << quote(header.reason) << ",\n"
       << "  \"peers\": [";
  for (size_t i = 0; i < header.peers.size(); ++i)
    json << (i ? ",\n" : "\n") << "    " << quote(header.peers[i]);
  json << (header.peers.empty() ? "]" : "\n  ]") << ",\n"
       << "  \"collectives\": [";
  std::vector<FlightEntry> all = entries();
  for (size_t i = 0; i < all.size(); ++i) {
    const FlightEntry &e = all[i];
    json << (i ? ",\n" : "\n") << "    {\"seq\": " << e.seq
         << ", \"collective\": " << quote(e.collective)
         << ", \"function\": " << quote(e.function)
         << ", \"op\": " << quote(e.op)
         << ", \"location\": " << quote(e.location)
         << ", \"phase\": " << quote(e.phase)
         << ", \"shape\": " << quote(e.shape)
         << ", \"dtype\": " << quote(e.dtype) << ", \"bytes\": " << e.bytes
         << ", \"state\": " << quote(stateName(e.state))
         << ", \"start_unix_ms\": " << e.startUnixMs
         << ", \"duration_ms\": " << e.durationMs
         << ", \"error\": " << quote(e.error) << "}";
  }
  json << (all.empty() ? "]" : "\n  ]") << "\n}\n";
  return json.str();
}

std::string FlightRecorder::write(const std::string &dir,
                                  const Header &header) const {
  std::string base = dir.empty() ? std::string(".") : dir;
  if (base.back() != '/')
    base += '/';
  std::string path =
      base + "dloss-flight-rank" + std::to_string(header.rank) + ".json";
  std::string text = toJson(header);
  // Written beside and renamed, so a reader never sees half a record.
  std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    if (!out)
      throw std::runtime_error("cannot open '" + partial +
                               "': " + std::strerror(errno));
    out << text;
    out.flush();
    if (!out)
      throw std::runtime_error("cannot write '" + partial + "'");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + partial + "' to '" + path +
                             "': " + std::strerror(errno));
  return path;
}

} // namespace dloss
