// NumPy .npy reader and writer; the format is the one numpy/lib/format.py
// documents and writes.
#include "runtime/io/Npy.h"

#include "runtime/support/Error.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>
#include <vector>

// Element bytes are copied verbatim between files and tensors, which is only
// right where the host byte order is the file's (little-endian).
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dloss::npy assumes a little-endian host"
#endif

namespace dloss {
namespace npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// numpy aligns the data start to 64 bytes so that it can be memory-mapped.
constexpr size_t kArrayAlign = 64;
// numpy >= 1.23 pads the header so the first dim can grow in place; copying
// it makes our files byte-identical to numpy.save's.
constexpr size_t kGrowthAxisMaxDigits = 21;
// Real headers are < 1 KiB; the cap stops a corrupt length field from making
// us allocate gigabytes before noticing the file is short.
constexpr uint64_t kMaxHeaderLen = 1 << 20;
constexpr size_t kMaxDims = 64;

const char *const kMalformedHint =
    "The file is not a valid .npy file; write it with numpy.save(path, array) "
    "or dloss::npy::save";
const char *const kDtypeHint = "Convert the array before saving it, e.g. "
                               "numpy.save(path, array.astype(numpy.float32))";

struct DtypeEntry {
  at::ScalarType type;
  // The descr without its byte-order character, e.g. "f4".
  const char *code;
  const char *name;
  size_t itemSize;
};

const DtypeEntry kDtypes[] = {
    {at::kHalf, "f2", "float16", 2},   {at::kFloat, "f4", "float32", 4},
    {at::kDouble, "f8", "float64", 8}, {at::kChar, "i1", "int8", 1},
    {at::kShort, "i2", "int16", 2},    {at::kInt, "i4", "int32", 4},
    {at::kLong, "i8", "int64", 8},     {at::kByte, "u1", "uint8", 1},
    {at::kBool, "b1", "bool", 1},
};

std::string supportedDtypes() {
  std::string list;
  for (const DtypeEntry &entry : kDtypes) {
    if (!list.empty())
      list += ", ";
    list += entry.name;
  }
  return list;
}

[[noreturn]] void fail(const std::string &path, const std::string &problem,
                       const std::string &hint) {
  throw Error("npy file '" + path + "': " + problem, hint);
}

// Header text is untrusted; show it escaped and bounded in messages.
std::string quoteForMessage(const std::string &text) {
  constexpr size_t kMaxShown = 200;
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMaxShown)
    out += "...";
  return out + "\"";
}

struct Header {
  std::string descr;
  bool fortranOrder = false;
  std::vector<int64_t> shape;
};

// Parses the Python dict literal of a .npy header. It accepts what numpy
// writes (and Python 2's "3L" dims) without evaluating anything, and reports
// every deviation as an Error rather than guessing.
class HeaderParser {
public:
  HeaderParser(const std::string &text, const std::string &path)
      : text(text), path(path) {}

  Header parse() {
    Header header;
    bool haveDescr = false, haveOrder = false, haveShape = false;
    skipSpace();
    expect('{', "the header must be a dict literal starting with '{'");
    while (true) {
      skipSpace();
      if (consume('}'))
        break;
      std::string key = parseString("a quoted key");
      skipSpace();
      expect(':', "expected ':' after key '" + key + "'");
      skipSpace();
      if (key == "descr") {
        checkFirst(haveDescr, key);
        if (peek() == '[')
          fail(path,
               "structured dtypes (a list of fields) are not supported; "
               "dloss reads " +
                   supportedDtypes(),
               kDtypeHint);
        header.descr = parseString("a quoted dtype string for 'descr'");
      } else if (key == "fortran_order") {
        checkFirst(haveOrder, key);
        header.fortranOrder = parseBool();
      } else if (key == "shape") {
        checkFirst(haveShape, key);
        header.shape = parseShape();
      } else {
        error("unexpected key '" + key +
              "' (a .npy header has exactly 'descr', 'fortran_order' and "
              "'shape')");
      }
      skipSpace();
      if (consume('}'))
        break;
      expect(',', "expected ',' or '}' after the value of '" + key + "'");
    }
    skipSpace();
    if (pos != text.size())
      error("unexpected text after the closing '}'");
    if (!haveDescr || !haveOrder || !haveShape)
      error(std::string("missing key '") +
            (!haveDescr   ? "descr"
             : !haveOrder ? "fortran_order"
                          : "shape") +
            "'");
    return header;
  }

private:
  [[noreturn]] void error(const std::string &problem) {
    fail(path,
         "malformed header: " + problem + " (at character " +
             std::to_string(pos) + " of " + quoteForMessage(text) + ")",
         kMalformedHint);
  }

  char peek() const { return pos < text.size() ? text[pos] : '\0'; }

  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' ||
                                 text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }

  bool consume(char c) {
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }

  void expect(char c, const std::string &problem) {
    if (!consume(c))
      error(problem);
  }

  void checkFirst(bool &seen, const std::string &key) {
    if (seen)
      error("key '" + key + "' appears twice");
    seen = true;
  }

  std::string parseString(const std::string &what) {
    char quote = peek();
    if (quote != '\'' && quote != '"')
      error("expected " + what);
    size_t start = ++pos;
    while (pos < text.size() && text[pos] != quote) {
      // numpy never writes escapes; refusing them keeps the parser simple.
      if (text[pos] == '\\')
        error("escape sequences in strings are not supported");
      ++pos;
    }
    if (pos == text.size())
      error("unterminated string");
    return text.substr(start, pos++ - start);
  }

  bool parseBool() {
    for (const char *word : {"True", "False"}) {
      size_t len = std::strlen(word);
      if (text.compare(pos, len, word) == 0) {
        pos += len;
        return word[0] == 'T';
      }
    }
    error("'fortran_order' must be True or False");
  }

  std::vector<int64_t> parseShape() {
    std::vector<int64_t> shape;
    expect('(', "'shape' must be a tuple of integers, e.g. (2, 3)");
    while (true) {
      skipSpace();
      if (consume(')'))
        break;
      if (peek() == '-')
        error("negative dimension in 'shape'");
      if (peek() < '0' || peek() > '9')
        error("'shape' must be a tuple of non-negative integers");
      uint64_t dim = 0;
      while (peek() >= '0' && peek() <= '9') {
        dim = dim * 10 + static_cast<uint64_t>(peek() - '0');
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          error("dimension in 'shape' does not fit in 64 bits");
        ++pos;
      }
      consume('L'); // Python 2 wrote longs as "3L".
      if (shape.size() == kMaxDims)
        error("'shape' has more than " + std::to_string(kMaxDims) +
              " dimensions");
      shape.push_back(static_cast<int64_t>(dim));
      skipSpace();
      if (consume(')'))
        break;
      expect(',', "expected ',' or ')' in 'shape'");
    }
    return shape;
  }

  const std::string &text;
  const std::string &path;
  size_t pos = 0;
};

const DtypeEntry &lookupDescr(const std::string &descr,
                              const std::string &path) {
  std::string code = descr;
  char order = '|';
  if (!code.empty() && std::strchr("<>|=", code[0]) != nullptr) {
    order = code[0];
    code.erase(0, 1);
  }
  for (const DtypeEntry &entry : kDtypes) {
    if (code != entry.code)
      continue;
    // Byte order is meaningless for one-byte types, whatever the file says.
    if (order == '>' && entry.itemSize > 1)
      fail(path,
           "dtype '" + descr +
               "' is big-endian; dloss reads little-endian "
               "data only",
           "Convert it before saving, e.g. numpy.save(path, "
           "array.astype(array.dtype.newbyteorder('<')))");
    return entry;
  }
  fail(path,
       "unsupported dtype '" + descr + "'; dloss reads " + supportedDtypes(),
       kDtypeHint);
}

const DtypeEntry *lookupScalarType(at::ScalarType type) {
  for (const DtypeEntry &entry : kDtypes)
    if (entry.type == type)
      return &entry;
  return nullptr;
}

struct FileCloser {
  void operator()(std::FILE *file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// Reads exactly `size` bytes or fails, naming the file.
void readExactly(std::FILE *file, void *data, size_t size,
                 const std::string &path, const char *what) {
  if (size == 0)
    return;
  if (std::fread(data, 1, size, file) != size)
    fail(path,
         std::string("could not read the ") + what +
             (std::ferror(file) ? std::string(": ") + std::strerror(errno)
                                : std::string(": unexpected end of file")),
         "Check that the file is not being written concurrently or damaged");
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(shape[i]);
  }
  // Python's repr of a one-tuple keeps the comma: (5,).
  if (shape.size() == 1)
    out += ",";
  return out + ")";
}

} // namespace

at::Tensor load(const std::string &path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    fail(path,
         "cannot open: " +
             (ec ? ec.message() : std::string("no such file or directory")),
         "Check the path and the working directory");
  if (fs::is_directory(status))
    fail(path, "is a directory, not a .npy file", "Pass the path of a file");
  if (!fs::is_regular_file(status))
    fail(path, "is not a regular file", "Pass the path of a .npy file");
  uint64_t fileSize = fs::file_size(path, ec);
  if (ec)
    fail(path, "cannot read its size: " + ec.message(),
         "Check that the file is readable");

  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file)
    fail(path, std::string("cannot open: ") + std::strerror(errno),
         "Check that the file exists and is readable");

  // Magic (6), version (2), header length (2 in 1.0, 4 in 2.0 and 3.0).
  unsigned char prefix[12];
  size_t prefixRead = static_cast<size_t>(std::min<uint64_t>(fileSize, 10));
  readExactly(file.get(), prefix, prefixRead, path, "header");
  if (std::memcmp(prefix, kMagic, std::min(prefixRead, kMagicLen)) != 0)
    fail(path,
         "not a .npy file (it does not start with the magic bytes "
         "\"\\x93NUMPY\")",
         kMalformedHint);
  if (prefixRead < 10)
    fail(path,
         fileSize == 0
             ? std::string("the file is empty")
             : "truncated header: the file has " + std::to_string(fileSize) +
                   " bytes, a .npy header needs at least 10",
         kMalformedHint);

  unsigned major = prefix[6], minor = prefix[7];
  uint64_t headerLen;
  size_t prefixLen;
  if (major == 1 && minor == 0) {
    prefixLen = 10;
    headerLen = prefix[8] | (static_cast<uint64_t>(prefix[9]) << 8);
  } else if ((major == 2 || major == 3) && minor == 0) {
    prefixLen = 12;
    if (fileSize < prefixLen)
      fail(path,
           "truncated header: the file has " + std::to_string(fileSize) +
               " bytes, a version " + std::to_string(major) +
               ".0 header needs at least 12",
           kMalformedHint);
    readExactly(file.get(), prefix + 10, 2, path, "header");
    headerLen = 0;
    for (int i = 3; i >= 0; --i)
      headerLen = (headerLen << 8) | prefix[8 + i];
  } else {
    fail(path,
         "unsupported .npy format version " + std::to_string(major) + "." +
             std::to_string(minor) + "; dloss reads versions 1.0, 2.0 and 3.0",
         "Re-save the array with numpy.save");
  }
  if (headerLen > fileSize - prefixLen)
    fail(path,
         "truncated header: it declares " + std::to_string(headerLen) +
             " header bytes but only " + std::to_string(fileSize - prefixLen) +
             " follow",
         kMalformedHint);
  if (headerLen > kMaxHeaderLen)
    fail(path, "header of " + std::to_string(headerLen) + " bytes is too large",
         kMalformedHint);

  std::string text(static_cast<size_t>(headerLen), '\0');
  readExactly(file.get(), text.data(), text.size(), path, "header");
  Header header = HeaderParser(text, path).parse();
  const DtypeEntry &dtype = lookupDescr(header.descr, path);

  // Overflow-checked counts, as shapes come from the file. Zero-size dims
  // still make ATen compute strides from the other dims, so those must fit
  // in 64 bits too.
  uint64_t product = 1;
  bool overflow = false;
  for (int64_t dim : header.shape)
    overflow |= __builtin_mul_overflow(
        product, std::max<uint64_t>(static_cast<uint64_t>(dim), 1), &product);
  bool hasZeroDim = std::find(header.shape.begin(), header.shape.end(), 0) !=
                    header.shape.end();
  uint64_t numel = hasZeroDim ? 0 : product;
  uint64_t dataBytes = 0;
  overflow |=
      product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype.itemSize),
                             &dataBytes);
  if (overflow)
    fail(path,
         "shape " + shapeString(header.shape) +
             " has more elements than fit in 64 bits",
         kMalformedHint);
  uint64_t available = fileSize - prefixLen - headerLen;
  if (available < dataBytes)
    fail(path,
         "data is shorter than the header says: shape " +
             shapeString(header.shape) + " of " + dtype.name + " needs " +
             std::to_string(dataBytes) + " bytes but the file has " +
             std::to_string(available),
         "The file is truncated; write it again");
  if (available > dataBytes)
    fail(path,
         "the file has " + std::to_string(available - dataBytes) +
             " bytes after the data that shape " + shapeString(header.shape) +
             " of " + dtype.name + " accounts for",
         "The header does not match the data; write the file again with "
         "numpy.save");

  // A Fortran-ordered array is the C-ordered transpose of its reversed shape.
  std::vector<int64_t> storedShape = header.shape;
  if (header.fortranOrder)
    std::reverse(storedShape.begin(), storedShape.end());
  at::Tensor tensor;
  try {
    tensor = at::empty(storedShape, at::TensorOptions(dtype.type));
  } catch (const c10::Error &e) {
    fail(path,
         "cannot allocate " + std::to_string(dataBytes) + " bytes for shape " +
             shapeString(header.shape) + ": " + e.what_without_backtrace(),
         "Free memory or load a smaller array");
  }
  readExactly(file.get(), tensor.data_ptr(), static_cast<size_t>(dataBytes),
              path, "data");

  // A bool byte other than 0 or 1 is undefined behaviour in C++; numpy treats
  // any non-zero byte as True, so normalise it.
  if (dtype.type == at::kBool) {
    auto *bytes = static_cast<unsigned char *>(tensor.data_ptr());
    for (uint64_t i = 0; i < numel; ++i)
      bytes[i] = bytes[i] != 0;
  }

  if (header.fortranOrder && storedShape.size() > 1) {
    std::vector<int64_t> reversed(storedShape.size());
    for (size_t i = 0; i < reversed.size(); ++i)
      reversed[i] = static_cast<int64_t>(reversed.size() - 1 - i);
    tensor = tensor.permute(reversed).contiguous();
  }
  return tensor;
}

void save(const std::string &path, const at::Tensor &tensor) {
  if (!tensor.defined())
    fail(path, "cannot save an undefined tensor",
         "Pass a tensor that holds data");
  if (tensor.layout() != at::kStrided)
    fail(path, "cannot save a tensor with a non-strided layout",
         "Convert it first with tensor.to_dense()");
  if (!tensor.device().is_cpu())
    fail(path,
         "the tensor is on device " + tensor.device().str() +
             "; .npy files are written from CPU tensors",
         "Copy it first with tensor.cpu()");
  const DtypeEntry *dtype = lookupScalarType(tensor.scalar_type());
  if (!dtype)
    fail(path,
         std::string("dtype ") + c10::toString(tensor.scalar_type()) +
             " cannot be written; dloss writes " + supportedDtypes(),
         "Convert it first, e.g. tensor.to(at::kFloat)");

  // Lazy negation/conjugation bits must be applied before copying raw bytes.
  at::Tensor data = tensor.detach().resolve_conj().resolve_neg().contiguous();
  std::vector<int64_t> shape(data.sizes().begin(), data.sizes().end());

  // Built exactly as numpy.save (format 1.0) builds it, so files compare equal.
  std::string descr =
      std::string(dtype->itemSize == 1 ? "|" : "<") + dtype->code;
  std::string dict =
      "{'descr': '" + descr +
      "', 'fortran_order': False, 'shape': " + shapeString(shape) + ", }";
  if (!shape.empty())
    dict.append(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  size_t unpadded = kMagicLen + 2 + 2 + dict.size() + 1;
  size_t padding = kArrayAlign - unpadded % kArrayAlign;
  size_t headerLen = dict.size() + padding + 1;
  // Unreachable with at most 64 dims, but a wrong length field would corrupt
  // the file silently.
  if (headerLen > 0xffff)
    fail(path, "the header is too long for .npy format 1.0",
         "Save a tensor with fewer dimensions");
  std::string bytes(kMagic, kMagicLen);
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(headerLen & 0xff);
  bytes += static_cast<char>(headerLen >> 8);
  bytes += dict;
  bytes.append(padding, ' ');
  bytes += '\n';

  size_t dataBytes = static_cast<size_t>(data.numel()) * dtype->itemSize;
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file)
    fail(path, std::string("cannot open for writing: ") + std::strerror(errno),
         "Check that the directory exists and is writable");
  bool ok =
      std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  if (ok && dataBytes > 0)
    ok = std::fwrite(data.data_ptr(), 1, dataBytes, file.get()) == dataBytes;
  int savedErrno = errno;
  // fclose flushes; its failure (e.g. disk full) also loses data.
  if (std::fclose(file.release()) != 0 && ok) {
    ok = false;
    savedErrno = errno;
  }
  if (!ok) {
    std::remove(path.c_str());
    fail(path, std::string("write failed: ") + std::strerror(savedErrno),
         "Check free disk space and permissions");
  }
}

} // namespace npy
} // namespace dloss
