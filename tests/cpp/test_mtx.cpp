#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gnnio/common/error.h"
#include "gnnio/graph/mtx.h"

namespace {

gnnio::MtxGraph parse(const std::string& s) { return gnnio::parse_mtx(s.data(), s.size()); }

void expect_invalid(const std::string& text, const std::string& fragment) {
  try {
    parse(text);
    FAIL() << "expected an error for:\n" << text;
  } catch (const gnnio::Error& e) {
    EXPECT_EQ(e.kind(), gnnio::ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

TEST(Mtx, ParsesPatternGeneral) {
  auto g = parse("%%MatrixMarket matrix coordinate pattern general\n% c\n3 4 2\n1 2\n3 4\n");
  EXPECT_EQ(g.num_rows, 3);
  EXPECT_EQ(g.num_cols, 4);
  EXPECT_FALSE(g.symmetric);
  EXPECT_EQ(g.row, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g.col, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(g.value.empty());
}

TEST(Mtx, ParsesRealSymmetricWithCrLf) {
  auto g = parse("%%MatrixMarket matrix coordinate real symmetric\r\n2 2 1\r\n2 1 0.5\r\n");
  EXPECT_TRUE(g.symmetric);
  ASSERT_EQ(g.value.size(), 1u);
  EXPECT_DOUBLE_EQ(g.value[0], 0.5);
}

TEST(Mtx, MalformedFilesGiveClearErrors) {
  expect_invalid("", "empty");
  expect_invalid("hello\n", "banner");
  expect_invalid("%%MatrixMarket matrix array real general\n2 2\n", "coordinate");
  expect_invalid("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 1\n", "field");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n", "size line");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 x 1\n", "rows cols");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 1\n", "holds 1");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1\n2 2\n", "more entries");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n3 1\n", "outside");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n0 1\n", "1-based");
  expect_invalid("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1\n", "value");
  expect_invalid("%%MatrixMarket matrix coordinate pattern general\n2 2 99999999999\n1 1\n",
                 "more than the file");
}

TEST(Mtx, ReadsBundledCora) {
  auto g = gnnio::read_mtx(std::string(GNNIO_DATA_DIR) + "/cora.mtx.gz");
  EXPECT_EQ(g.num_rows, 2708);
  EXPECT_EQ(g.row.size(), 5278u);  // stored once; 10,556 directed edges (Planetoid's count)
  EXPECT_TRUE(g.symmetric);
}

TEST(Mtx, MissingAndCorruptFilesRaiseIoErrors) {
  EXPECT_THROW(gnnio::read_mtx("/nonexistent/graph.mtx"), gnnio::Error);
  const std::string path = testing::TempDir() + "/corrupt.mtx.gz";
  std::ofstream(path) << "this is not gzip";
  try {
    gnnio::read_mtx(path);
    FAIL();
  } catch (const gnnio::Error& e) {
    // zlib reads non-gzip data transparently, so the parser reports the bad banner.
    EXPECT_TRUE(e.kind() == gnnio::ErrorKind::kIo || e.kind() == gnnio::ErrorKind::kInvalidArgument);
  }
  std::remove(path.c_str());
}

}  // namespace
