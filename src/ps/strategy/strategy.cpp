// Placeholder of the parameter-server seam (issue 13): filled in by its part.
#include "flowlet/ps_options.hpp"

namespace flowlet {
std::string to_string(TrainingMode mode) {
  switch (mode) {
    case TrainingMode::async:
      return "async";
    case TrainingMode::sync:
      return "sync";
    case TrainingMode::bounded_staleness:
      return "bounded_staleness";
  }
  return "unknown";
}
}  // namespace flowlet
