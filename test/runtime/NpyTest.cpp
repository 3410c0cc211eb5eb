// Tests for dloss::npy: round trips, the exact bytes written, hand-made files
// and every malformed-file error.
#include "runtime/io/Npy.h"
#include "runtime/support/Error.h"
#include "test/runtime/RemoveTree.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

// A fresh directory per test: ctest runs the discovered tests in parallel.
class NpyTest : public ::testing::Test {
protected:
  void SetUp() override {
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." +
                       info->name() + "." + std::to_string(::getpid());
    for (char &c : name)
      if (c == '/')
        c = '_';
    dir = fs::temp_directory_path() / ("dloss-npy-test-" + name);
    dloss::test::removeTree(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { dloss::test::removeTree(dir); }

  std::string path(const std::string &name) const {
    return (dir / name).string();
  }

  fs::path dir;
};

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <typename T> std::string rawBytes(const std::vector<T> &values) {
  return std::string(reinterpret_cast<const char *>(values.data()),
                     values.size() * sizeof(T));
}

// A .npy file with the given header dict; the prefix is built by hand so the
// tests do not depend on the writer under test.
std::string makeNpy(const std::string &dict, const std::string &data,
                    int major = 1) {
  std::string header = dict + "\n";
  std::string bytes = std::string("\x93NUMPY", 6);
  bytes += static_cast<char>(major);
  bytes += '\0';
  uint32_t len = static_cast<uint32_t>(header.size());
  int lenBytes = major == 1 ? 2 : 4;
  for (int i = 0; i < lenBytes; ++i)
    bytes += static_cast<char>((len >> (8 * i)) & 0xff);
  return bytes + header + data;
}

std::string tensorBytes(const at::Tensor &tensor) {
  at::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char *>(contiguous.data_ptr()),
                     contiguous.numel() * contiguous.element_size());
}

// Same dtype, same shape and the same bytes (so NaN payloads and -0.0 count).
void expectIdentical(const at::Tensor &actual, const at::Tensor &expected) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_EQ(tensorBytes(actual), tensorBytes(expected));
}

at::Tensor sample(at::ScalarType type, at::IntArrayRef shape) {
  at::Tensor t;
  if (type == at::kBool)
    t = at::randint(0, 2, shape, at::kLong).to(at::kBool);
  else if (type == at::kByte)
    t = at::randint(0, 256, shape, at::kLong).to(at::kByte);
  else if (type == at::kChar)
    t = at::randint(-128, 128, shape, at::kLong).to(at::kChar);
  else if (at::isFloatingType(type))
    t = (at::randn(shape, at::kDouble) * 1000).to(type);
  else
    t = at::randint(-1000000, 1000000, shape, at::kLong).to(type);
  if (at::isFloatingType(type) && t.numel() >= 4) {
    at::Tensor flat = t.view({-1});
    flat[0] = std::numeric_limits<double>::infinity();
    flat[1] = -std::numeric_limits<double>::infinity();
    flat[2] = std::numeric_limits<double>::quiet_NaN();
    flat[3] = -0.0;
  }
  return t;
}

struct DtypeCase {
  at::ScalarType type;
  const char *name;
};

const DtypeCase kDtypeCases[] = {
    {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"},
    {at::kLong, "int64"},    {at::kInt, "int32"},      {at::kShort, "int16"},
    {at::kChar, "int8"},     {at::kByte, "uint8"},     {at::kBool, "bool"},
};

// Prints the dtype name instead of raw bytes in test names and failures.
void PrintTo(const DtypeCase &c, std::ostream *os) { *os << c.name; }

class NpyRoundTripTest : public NpyTest,
                         public ::testing::WithParamInterface<DtypeCase> {};

TEST_P(NpyRoundTripTest, EveryShapeCategory) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, // 0-d
      {1},       {7},       {2, 3}, {2, 3, 4}, {1, 1, 1, 1, 5},
      {0},       {3, 0, 2}, {0, 0}, // zero-size
      {100, 33},                    // large enough for a multi-block copy
  };
  for (const auto &shape : shapes) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    at::Tensor t = sample(GetParam().type, shape);
    std::string file = path("t.npy");
    dloss::npy::save(file, t);
    expectIdentical(dloss::npy::load(file), t);
  }
}

TEST_P(NpyRoundTripTest, NonContiguousTensorsAreWrittenInLogicalOrder) {
  at::Tensor base = sample(GetParam().type, {4, 6});
  const std::vector<at::Tensor> views = {
      base.t(),                                         // transposed
      base.slice(1, 1, 6, 2),                           // strided columns
      base.select(1, 2),                                // one column
      base.slice(0, 0, 1).expand({3, 6}),               // stride 0
      base.unsqueeze(0).permute({2, 0, 1}).slice(0, 2), // permuted
  };
  for (size_t i = 0; i < views.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_FALSE(views[i].is_contiguous());
    dloss::npy::save(path("view.npy"), views[i]);
    dloss::npy::save(path("copy.npy"), views[i].contiguous());
    EXPECT_EQ(readFile(path("view.npy")), readFile(path("copy.npy")));
    expectIdentical(dloss::npy::load(path("view.npy")), views[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, NpyRoundTripTest,
                         ::testing::ValuesIn(kDtypeCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

TEST_F(NpyTest, SaveWritesExactlyWhatNumpyWrites) {
  // numpy.save(f, numpy.arange(6, dtype='<f4').reshape(2, 3)) with numpy
  // 1.24: the dict, 20 spaces of growth room (21 digits minus len("2")),
  // padding to a 64-byte boundary, a newline, then the data.
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(dict.size(), 59u);
  std::string expected = std::string("\x93NUMPY\x01\x00", 8);
  expected += std::string("\x76\x00", 2); // header length 118
  expected += dict + std::string(58, ' ') + "\n";
  ASSERT_EQ(expected.size(), 128u);
  expected += rawBytes(std::vector<float>{0, 1, 2, 3, 4, 5});

  dloss::npy::save(path("a.npy"), at::arange(6, at::kFloat).reshape({2, 3}));
  EXPECT_EQ(readFile(path("a.npy")), expected);
}

TEST_F(NpyTest, SaveWritesNumpyHeadersForOtherShapes) {
  // numpy.save(f, numpy.array(True)) and numpy.save(f, numpy.zeros(0, 'i1')).
  dloss::npy::save(path("b.npy"), at::scalar_tensor(true, at::kBool));
  std::string dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (), }";
  EXPECT_EQ(readFile(path("b.npy")),
            std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict +
                std::string(128 - 10 - dict.size() - 1, ' ') + "\n\x01");

  dloss::npy::save(path("e.npy"), at::zeros({0}, at::kChar));
  dict = "{'descr': '|i1', 'fortran_order': False, 'shape': (0,), }";
  EXPECT_EQ(readFile(path("e.npy")),
            std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict +
                std::string(128 - 10 - dict.size() - 1, ' ') + "\n");
}

TEST_F(NpyTest, LoadsFormatVersions2And3) {
  std::string dict =
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
  std::string data = rawBytes(std::vector<int32_t>{7, -8, 9});
  at::Tensor expected = at::tensor({7, -8, 9}, at::kInt);
  for (int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    writeFile(path("v.npy"), makeNpy(dict, data, major));
    expectIdentical(dloss::npy::load(path("v.npy")), expected);
  }
}

TEST_F(NpyTest, TransposesFortranOrder) {
  // numpy.asfortranarray(numpy.arange(6).reshape(2, 3)) stores columns.
  writeFile(
      path("f.npy"),
      makeNpy("{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3), }",
              rawBytes(std::vector<int64_t>{0, 3, 1, 4, 2, 5})));
  expectIdentical(dloss::npy::load(path("f.npy")),
                  at::arange(6, at::kLong).reshape({2, 3}));

  // Three dims: element (i, j, k) sits at i + 2 * j + 6 * k.
  at::Tensor expected = at::arange(24, at::kDouble).reshape({2, 3, 4});
  writeFile(
      path("f3.npy"),
      makeNpy("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3, 4), }",
              tensorBytes(expected.permute({2, 1, 0}))));
  expectIdentical(dloss::npy::load(path("f3.npy")), expected);

  // 0-d and 1-d arrays are the same in both orders.
  writeFile(path("f1.npy"),
            makeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
                    rawBytes(std::vector<float>{1.5f, 2.5f})));
  expectIdentical(dloss::npy::load(path("f1.npy")),
                  at::tensor({1.5f, 2.5f}, at::kFloat));
}

TEST_F(NpyTest, AcceptsHeaderVariantsOtherWritersUse) {
  std::string data = rawBytes(std::vector<uint8_t>{1, 2, 3, 4});
  at::Tensor expected = at::tensor({1, 2, 3, 4}, at::kByte).reshape({2, 2});
  for (const char *dict : {
           // Keys in another order, double quotes, no trailing comma.
           "{\"shape\": (2, 2), \"fortran_order\": False, \"descr\": \"|u1\"}",
           // Python 2 longs, extra spaces, a trailing comma in the tuple.
           "{ 'descr' : '<u1' , 'fortran_order' : False , 'shape' : ( 2L , 2L "
           ", ) , }",
           // Byte order does not matter for one-byte types.
           "{'descr': '>u1', 'fortran_order': False, 'shape': (2, 2)}",
           "{'descr': 'u1', 'fortran_order': False, 'shape': (2, 2)}",
       }) {
    SCOPED_TRACE(dict);
    writeFile(path("h.npy"), makeNpy(dict, data));
    expectIdentical(dloss::npy::load(path("h.npy")), expected);
  }
}

TEST_F(NpyTest, NormalisesBoolBytes) {
  writeFile(path("b.npy"),
            makeNpy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                    std::string("\x00\x02\xff", 3)));
  at::Tensor loaded = dloss::npy::load(path("b.npy"));
  EXPECT_EQ(tensorBytes(loaded), std::string("\x00\x01\x01", 3));
}

struct MalformedCase {
  const char *name;
  std::string bytes;
  // A phrase the message must contain, besides the file name.
  const char *expected;
};

std::string dictFor(const std::string &descr, const std::string &shape,
                    const std::string &order = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + order +
         ", 'shape': " + shape + ", }";
}

std::vector<MalformedCase> malformedCases() {
  std::string good = dictFor("<f4", "(2,)");
  std::string data = rawBytes(std::vector<float>{1, 2});
  std::string valid = makeNpy(good, data);
  std::string v2 = makeNpy(good, data, 2);
  return {
      {"Empty", "", "empty"},
      {"ShortMagic", std::string("\x93NUM", 4), "truncated header"},
      {"BadMagic", "PK\x03\x04 this is a zip file, not npy", "magic"},
      {"TextFile", "hello", "magic"},
      {"PrefixOnly", valid.substr(0, 9), "truncated header"},
      {"V2PrefixOnly", v2.substr(0, 11), "truncated header"},
      {"UnsupportedVersion", makeNpy(good, data, 4), "version 4.0"},
      {"UnsupportedMinor",
       [&] {
         std::string b = valid;
         b[7] = 1;
         return b;
       }(),
       "version 1.1"},
      {"TruncatedHeader", valid.substr(0, 30), "truncated header"},
      {"HugeHeaderLength",
       [&] {
         std::string b = v2;
         b[8] = b[9] = b[10] = b[11] = '\xff';
         return b;
       }(),
       "truncated header"},
      {"HeaderNotADict", makeNpy("[1, 2, 3]", data), "malformed header"},
      {"HeaderGarbage", makeNpy(std::string("\x01\xfe\n", 3), data),
       "malformed header"},
      {"UnterminatedString", makeNpy("{'descr': '<f4", data),
       "unterminated string"},
      {"UnclosedDict", makeNpy("{'descr': '<f4', 'fortran_order': False", data),
       "malformed header"},
      {"MissingShape",
       makeNpy("{'descr': '<f4', 'fortran_order': False, }", data),
       "missing key 'shape'"},
      {"MissingDescr",
       makeNpy("{'fortran_order': False, 'shape': (2,), }", data),
       "missing key 'descr'"},
      {"ExtraKey",
       makeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
               "'extra': 1, }",
               data),
       "unexpected key 'extra'"},
      {"DuplicateKey",
       makeNpy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
               "'shape': (2,), }",
               data),
       "appears twice"},
      {"TextAfterDict", makeNpy(good + " x", data), "after the closing"},
      {"BadFortranOrder", makeNpy(dictFor("<f4", "(2,)", "1"), data),
       "True or False"},
      {"NegativeDim", makeNpy(dictFor("<f4", "(-2,)"), data),
       "negative dimension"},
      {"NonIntegerDim", makeNpy(dictFor("<f4", "(2.0,)"), data),
       "expected ',' or ')'"},
      {"ShapeNotTuple", makeNpy(dictFor("<f4", "[2]"), data), "tuple"},
      {"DimTooLarge", makeNpy(dictFor("<f4", "(99999999999999999999,)"), data),
       "64 bits"},
      {"ShapeOverflow",
       makeNpy(dictFor("<f4", "(4294967296, 4294967296)"), data), "64 bits"},
      {"ShapeOverflowWithZero",
       makeNpy(dictFor("<f4", "(0, 4294967296, 4294967296)"), data), "64 bits"},
      {"ByteCountOverflow",
       makeNpy(dictFor("<f8", "(4611686018427387904,)"), data), "64 bits"},
      {"BigEndian", makeNpy(dictFor(">f4", "(2,)"), data), "big-endian"},
      {"Complex", makeNpy(dictFor("<c8", "(1,)"), data),
       "unsupported dtype '<c8'"},
      {"Uint32", makeNpy(dictFor("<u4", "(2,)"), data),
       "unsupported dtype '<u4'"},
      {"UnicodeString", makeNpy(dictFor("<U1", "(2,)"), data),
       "unsupported dtype '<U1'"},
      {"Object", makeNpy(dictFor("|O", "(1,)"), data),
       "unsupported dtype '|O'"},
      {"Structured",
       makeNpy("{'descr': [('a', '<f4')], 'fortran_order': False, "
               "'shape': (2,), }",
               data),
       "structured"},
      {"DataTooShort", makeNpy(dictFor("<f4", "(3,)"), data), "shorter"},
      {"DataMissing", makeNpy(dictFor("<f4", "(2, 2)"), ""), "shorter"},
      {"ZeroDimDataMissing", makeNpy(dictFor("<f8", "()"), ""), "shorter"},
      {"TrailingData", makeNpy(good, data + "xx"), "after the data"},
  };
}

// One test, not one per case: each discovered test is a process that spends
// most of its time loading LibTorch. SCOPED_TRACE names the failing case.
TEST_F(NpyTest, MalformedFilesRaiseErrorsNamingTheFile) {
  for (const MalformedCase &c : malformedCases()) {
    SCOPED_TRACE(c.name);
    std::string file = path(std::string(c.name) + ".npy");
    writeFile(file, c.bytes);
    try {
      dloss::npy::load(file);
      ADD_FAILURE() << "loading " << c.name << " did not throw";
    } catch (const dloss::Error &e) {
      std::string message = e.what();
      EXPECT_NE(message.find("'" + file + "'"), std::string::npos) << message;
      EXPECT_NE(message.find(c.expected), std::string::npos) << message;
      EXPECT_FALSE(e.hint().empty()) << message;
    }
  }
}

// Expects `load` to throw a dloss::Error whose message names `file`.
void expectLoadError(const std::string &file, const std::string &phrase) {
  try {
    dloss::npy::load(file);
    ADD_FAILURE() << "loading " << file << " did not throw";
  } catch (const dloss::Error &e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'" + file + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
  }
}

TEST_F(NpyTest, UnreadablePaths) {
  expectLoadError(path("does-not-exist.npy"), "cannot open");
  expectLoadError(dir.string(), "is a directory");
  // Permission bits do not stop root, which CI containers often are.
  if (::geteuid() != 0) {
    writeFile(path("locked.npy"), makeNpy(dictFor("|u1", "()"), "x"));
    fs::permissions(path("locked.npy"), fs::perms::none);
    expectLoadError(path("locked.npy"), "cannot open");
  }
}

// Every truncation of a valid file must raise dloss::Error, never crash or
// return a tensor (each prefix is missing header or data bytes).
TEST_F(NpyTest, EveryTruncationRaises) {
  for (int major : {1, 2}) {
    std::string valid =
        makeNpy(dictFor("<f8", "(2, 2)"),
                rawBytes(std::vector<double>{1, 2, 3, 4}), major);
    for (size_t len = 0; len < valid.size(); ++len) {
      SCOPED_TRACE(std::to_string(major) + ":" + std::to_string(len));
      writeFile(path("t.npy"), valid.substr(0, len));
      EXPECT_THROW(dloss::npy::load(path("t.npy")), dloss::Error);
    }
  }
}

// Corrupting any single header byte either still loads or raises
// dloss::Error; no other exception, no crash (run under ASan to check reads).
TEST_F(NpyTest, CorruptHeaderBytesNeverCrash) {
  std::string valid = makeNpy(dictFor("<i2", "(3, 1)"),
                              rawBytes(std::vector<int16_t>{1, 2, 3}));
  size_t headerEnd = valid.size() - 6;
  int loaded = 0, rejected = 0;
  for (size_t pos = 0; pos < headerEnd; ++pos) {
    for (int value :
         {0x00, 0x20, 0x27, 0x28, 0x29, 0x2c, 0x30, 0x39, 0x7b, 0x7d, 0xff}) {
      std::string bytes = valid;
      bytes[pos] = static_cast<char>(value);
      writeFile(path("c.npy"), bytes);
      try {
        at::Tensor t = dloss::npy::load(path("c.npy"));
        EXPECT_EQ(static_cast<size_t>(t.numel() * t.element_size()), 6u);
        ++loaded;
      } catch (const dloss::Error &) {
        ++rejected;
      } catch (const std::exception &e) {
        ADD_FAILURE() << "byte " << pos << " = " << value
                      << " raised a non-dloss exception: " << e.what();
      }
    }
  }
  // Both outcomes occur, or the corruption did not reach the parser.
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, 0);
}

// Expects `save` to throw a dloss::Error whose message names `file`.
void expectSaveError(const std::string &file, const at::Tensor &tensor,
                     const std::string &phrase) {
  try {
    dloss::npy::save(file, tensor);
    ADD_FAILURE() << "saving to " << file << " did not throw";
  } catch (const dloss::Error &e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'" + file + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_FALSE(e.hint().empty()) << message;
  }
}

TEST_F(NpyTest, SaveErrors) {
  expectSaveError(path("u.npy"), at::Tensor(), "undefined");
  expectSaveError(path("m.npy"), at::empty({2}, at::device(at::kMeta)),
                  "device meta");
  expectSaveError(path("c.npy"), at::zeros({2}, at::kComplexFloat),
                  "cannot be written");
  expectSaveError(path("h.npy"), at::zeros({2}, at::kBFloat16),
                  "cannot be written");
  expectSaveError(path("s.npy"), at::zeros({2, 2}).to_sparse(), "non-strided");
  expectSaveError(path("no-such-dir/x.npy"), at::zeros({2}),
                  "cannot open for writing");
  EXPECT_FALSE(fs::exists(path("u.npy")));
}

TEST_F(NpyTest, SaveResolvesLazyNegation) {
  at::Tensor t = at::tensor({1.0f, -2.0f});
  at::Tensor negated = at::_neg_view(t);
  ASSERT_TRUE(negated.is_neg());
  dloss::npy::save(path("n.npy"), negated);
  expectIdentical(dloss::npy::load(path("n.npy")), at::tensor({-1.0f, 2.0f}));
}

} // namespace
