// errors.h — the two exception types the core throws; bindings map them to ValueError / TypeError.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace moe_cpu {

struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct TypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Builds a message from stream pieces: throw ValueError(msg("k=", k, " > E=", E)).
template <class... Ts>
std::string msg(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace moe_cpu
