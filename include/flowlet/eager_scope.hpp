// EagerScope and is_tracing(): whether an op call runs now or is recorded into the function being
// traced on this thread.
#pragma once

namespace flowlet {

namespace detail {
class TraceBuilder;
}  // namespace detail

// Ops inside run eagerly even while a function is being traced: one-time set-up such as creating
// variables and optimizer slots. Scopes nest; each is per thread.
//
//   auto step = fl::trace([&](fl::Tensor x) {
//     fl::EagerScope eager;  // runs once, at trace time
//     ...
//   });
class EagerScope {
 public:
  EagerScope();
  ~EagerScope();
  EagerScope(const EagerScope&) = delete;
  EagerScope& operator=(const EagerScope&) = delete;

 private:
  detail::TraceBuilder* suspended_;  // the trace active when the scope began; active again at its end
};

// True while the calling thread is tracing a function (ops record instead of running).
bool is_tracing();

}  // namespace flowlet
