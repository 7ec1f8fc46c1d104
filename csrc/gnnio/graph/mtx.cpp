#include "gnnio/graph/mtx.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "gnnio/common/error.h"

#ifdef GNNIO_WITH_ZLIB
#include <zlib.h>
#endif

namespace gnnio {
namespace {

class LineReader {
 public:
  LineReader(const char* text, size_t size) : cur_(text), end_(text + size) {}

  // Next line without its terminator; false at the end of the text.
  bool next(const char*& begin, const char*& end) {
    if (cur_ >= end_) return false;
    begin = cur_;
    const void* nl = std::memchr(cur_, '\n', static_cast<size_t>(end_ - cur_));
    end = nl ? static_cast<const char*>(nl) : end_;
    cur_ = nl ? end + 1 : end_;
    if (end > begin && end[-1] == '\r') --end;
    ++line_;
    return true;
  }
  int64_t line() const { return line_; }

 private:
  const char* cur_;
  const char* end_;
  int64_t line_ = 0;
};

std::string lower(const char* b, const char* e) {
  std::string s(b, e);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool blank(const char* b, const char* e) {
  for (; b < e; ++b)
    if (!std::isspace(static_cast<unsigned char>(*b))) return false;
  return true;
}

// Copies the next blank-separated token at p into buf (NUL-terminated) and advances p;
// false when there is none or it does not fit.
template <size_t N>
bool next_token(const char*& p, const char* end, char (&buf)[N]) {
  while (p < end && (*p == ' ' || *p == '\t')) ++p;
  size_t n = 0;
  while (p < end && n < N - 1 && !std::isspace(static_cast<unsigned char>(*p))) buf[n++] = *p++;
  buf[n] = '\0';
  return n > 0 && (p >= end || std::isspace(static_cast<unsigned char>(*p)));
}

bool read_int(const char*& p, const char* end, int64_t& out) {
  char buf[32];
  if (!next_token(p, end, buf)) return false;
  char* stop = nullptr;
  errno = 0;
  out = std::strtoll(buf, &stop, 10);
  return *stop == '\0' && errno == 0;
}

bool read_real(const char*& p, const char* end, double& out) {
  char buf[64];
  if (!next_token(p, end, buf)) return false;
  char* stop = nullptr;
  out = std::strtod(buf, &stop);
  return *stop == '\0';
}

}  // namespace

MtxGraph parse_mtx(const char* text, size_t size) {
  LineReader lines(text, size);
  const char *b = nullptr, *e = nullptr;
  GNNIO_CHECK(lines.next(b, e), ErrorKind::kInvalidArgument, "mtx: empty file");

  std::istringstream banner(lower(b, e));
  std::string tag, object, format, field, symmetry;
  banner >> tag >> object >> format >> field >> symmetry;
  GNNIO_CHECK(tag == "%%matrixmarket", ErrorKind::kInvalidArgument,
              "mtx line 1: expected a '%%MatrixMarket' banner");
  GNNIO_CHECK(object == "matrix" && format == "coordinate", ErrorKind::kInvalidArgument,
              "mtx line 1: only 'matrix coordinate' files hold graphs (got '", object, " ",
              format, "')");
  GNNIO_CHECK(field == "pattern" || field == "real" || field == "integer" || field == "double",
              ErrorKind::kInvalidArgument, "mtx line 1: unsupported field '", field, "'");
  GNNIO_CHECK(symmetry == "general" || symmetry == "symmetric" || symmetry == "skew-symmetric",
              ErrorKind::kInvalidArgument, "mtx line 1: unsupported symmetry '", symmetry, "'");
  const bool has_value = field != "pattern";

  MtxGraph g;
  g.symmetric = symmetry != "general";

  // Size line: first line that is neither a comment nor blank.
  int64_t nnz = -1, size_line = 0;
  while (lines.next(b, e)) {
    if (b < e && *b == '%') continue;
    if (blank(b, e)) continue;
    const char* p = b;
    GNNIO_CHECK(read_int(p, e, g.num_rows) && read_int(p, e, g.num_cols) && read_int(p, e, nnz) &&
                    blank(p, e),
                ErrorKind::kInvalidArgument, "mtx line ", lines.line(),
                ": expected 'rows cols entries'");
    size_line = lines.line();
    break;
  }
  GNNIO_CHECK(nnz >= 0, ErrorKind::kInvalidArgument, "mtx: missing size line");
  GNNIO_CHECK(g.num_rows >= 0 && g.num_cols >= 0, ErrorKind::kInvalidArgument,
              "mtx: negative matrix size");
  // Each entry needs at least 4 bytes ("1 1\n"): a bound that stops a corrupt count from
  // reserving terabytes.
  GNNIO_CHECK(nnz <= static_cast<int64_t>(size / 4 + 1), ErrorKind::kInvalidArgument,
              "mtx: the size line declares ", nnz, " entries, more than the file can hold");
  g.row.reserve(nnz);
  g.col.reserve(nnz);
  if (has_value) g.value.reserve(nnz);

  while (lines.next(b, e)) {
    if ((b < e && *b == '%') || blank(b, e)) continue;
    GNNIO_CHECK(static_cast<int64_t>(g.row.size()) < nnz, ErrorKind::kInvalidArgument, "mtx line ",
                lines.line(), ": more entries than the ", nnz, " the size line declares");
    const char* p = b;
    int64_t i = 0, j = 0;
    GNNIO_CHECK(read_int(p, e, i) && read_int(p, e, j), ErrorKind::kInvalidArgument, "mtx line ",
                lines.line(), ": expected 'row col", has_value ? " value'" : "'");
    GNNIO_CHECK(i >= 1 && i <= g.num_rows && j >= 1 && j <= g.num_cols, ErrorKind::kInvalidArgument,
                "mtx line ", lines.line(), ": entry (", i, ", ", j, ") is outside the ",
                g.num_rows, " x ", g.num_cols, " matrix (ids are 1-based)");
    if (has_value) {
      double v = 0;
      GNNIO_CHECK(read_real(p, e, v), ErrorKind::kInvalidArgument, "mtx line ", lines.line(),
                  ": missing or bad value");
      g.value.push_back(v);
    }
    g.row.push_back(i - 1);
    g.col.push_back(j - 1);
  }
  GNNIO_CHECK(static_cast<int64_t>(g.row.size()) == nnz, ErrorKind::kInvalidArgument, "mtx line ",
              size_line, ": the size line declares ", nnz, " entries but the file holds ",
              g.row.size());
  return g;
}

namespace {

std::string read_file(const std::string& path) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (gz) {
#ifdef GNNIO_WITH_ZLIB
    gzFile f = gzopen(path.c_str(), "rb");
    GNNIO_CHECK(f != nullptr, ErrorKind::kIo, "mtx: cannot open '", path, "'");
    std::string out;
    char buf[1 << 16];
    int n = 0;
    while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    int err = 0;
    const char* msg = gzerror(f, &err);
    gzclose(f);
    GNNIO_CHECK(n == 0 && err == Z_OK, ErrorKind::kIo, "mtx: '", path, "' is not valid gzip: ",
                msg ? msg : "");
    return out;
#else
    detail::fail(ErrorKind::kIo, "mtx: '", path, "' is gzip-compressed and gnnio was built without zlib");
#endif
  }
  std::ifstream f(path, std::ios::binary);
  GNNIO_CHECK(f.good(), ErrorKind::kIo, "mtx: cannot open '", path, "'");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

MtxGraph read_mtx(const std::string& path) {
  const std::string text = read_file(path);
  return parse_mtx(text.data(), text.size());
}

}  // namespace gnnio
