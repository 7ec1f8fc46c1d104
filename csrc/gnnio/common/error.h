// Errors raised by the core. The binding maps each kind to the Python exception a PyG user
// expects (IndexError for out-of-range node ids, ValueError for bad arguments, OSError for files).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gnnio {

enum class ErrorKind { kInvalidArgument, kIndex, kIo, kInternal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Parts>
[[noreturn]] void fail(ErrorKind kind, Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(kind, message.str());
}
}  // namespace detail

}  // namespace gnnio

// One macro so that the message is only formatted on failure.
#define GNNIO_CHECK(cond, kind, ...)                      \
  do {                                                    \
    if (!(cond)) ::gnnio::detail::fail(kind, __VA_ARGS__); \
  } while (0)
