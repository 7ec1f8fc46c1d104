// Matrix Market (coordinate) reader for graph structures.
//
// Entries are returned 0-based in file order. A `symmetric` file stores each undirected edge
// once; callers that want an edge_index expand it to both directions (to_edge_index in Python).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gnnio {

struct MtxGraph {
  int64_t num_rows = 0;
  int64_t num_cols = 0;
  bool symmetric = false;      // symmetric / skew-symmetric / hermitian storage
  std::vector<int64_t> row;    // 0-based row id of each stored entry
  std::vector<int64_t> col;    // 0-based column id of each stored entry
  std::vector<double> value;   // empty for `pattern` files
};

// Parses the whole text of a .mtx file. Throws gnnio::Error (kInvalidArgument) naming the line
// for anything malformed: bad banner, unsupported format, short or extra entries, bad ids.
MtxGraph parse_mtx(const char* text, size_t size);

// Reads a .mtx file, or a gzip-compressed .mtx.gz when the core was built with zlib.
MtxGraph read_mtx(const std::string& path);

}  // namespace gnnio
