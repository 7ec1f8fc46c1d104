// Errors raised by the core. The binding maps each kind to the Python exception a PyG user
// expects (IndexError for out-of-range node ids, ValueError for bad arguments, TypeError for an
// element type a path does not run, OSError for files).
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace gnnio {

enum class ErrorKind { kInvalidArgument, kIndex, kIo, kInternal, kType };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
void append(std::string& s, T v) {
  s += std::to_string(v);
}
}  // namespace detail

// Concatenates strings and numbers. Numbers go through std::to_string, never an iostream: on
// the device image, formatting a number through an ostream inside the extension crashed the
// process (seen with PyTorch 2.11's wheels and the image's g++ 13), plain text did not.
template <typename... Parts>
std::string text(const Parts&... parts) {
  std::string s;
  (detail::append(s, parts), ...);
  return s;
}

namespace detail {
template <typename... Parts>
[[noreturn]] void fail(ErrorKind kind, const Parts&... parts) {
  throw Error(kind, text(parts...));
}
}  // namespace detail

}  // namespace gnnio

// One macro so that the message is only formatted on failure.
#define GNNIO_CHECK(cond, kind, ...)                      \
  do {                                                    \
    if (!(cond)) ::gnnio::detail::fail(kind, __VA_ARGS__); \
  } while (0)
