// optimizer_update: the fused per-variable optimizer step (state/optimizer_update.hpp). Its CPU
// kernel makes one pass over the variable, its slots and the gradient, split over the pool, writing
// in place when nothing else holds a buffer (else into a fresh one, so readers keep the old value,
// as apply_variable_update does).
#include "state/optimizer_update.hpp"

#include <array>
#include <cmath>
#include <mutex>
#include <optional>
#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/core/half.hpp"
#include "flowlet/dispatch.hpp"
#include "runtime/thread_pool.hpp"
#include "trace/tracer.hpp"

namespace flowlet::detail {
namespace {

DType slot_dtype(DType var_dtype) { return var_dtype == f16 || var_dtype == bf16 ? f32 : var_dtype; }

// Reads and writes of one pass: `in` is read, `out` written (the same buffer when updating in place).
template <class T>
struct Stream {
  const T* in = nullptr;
  T* out = nullptr;
};

template <class T>
float to_float(T x) {
  return static_cast<float>(x);
}

// The per-element rules, in the slots' type S (f32 or f64); W is the variable's storage type.
// The expression order follows the per-op path in optim/optimizers.cpp, so both agree within
// S's rounding (they differ only where the compiler contracts a multiply-add).
template <class W, class S>
struct AdamRange {
  Stream<W> w;
  const W* g;
  Stream<S> m, v;
  S b1, one_minus_b1, b2, one_minus_b2, eps, corrected_lr, lr_decay;
  bool decay;

  void operator()(int64_t begin, int64_t end) const {
    if (decay) {
      run<true>(begin, end);
    } else {
      run<false>(begin, end);
    }
  }

  template <bool kDecay>
  void run(int64_t begin, int64_t end) const {
    int64_t i = begin;
#if defined(__AVX__)
    // GCC keeps errno semantics for sqrt (no -fno-math-errno here), which stops it vectorizing
    // this loop: f32 gets the same arithmetic, 8 lanes at a time, unfused like the scalar loop.
    if constexpr (std::is_same_v<W, float> && std::is_same_v<S, float>) i = run_avx<kDecay>(begin, end);
#endif
    for (; i < end; ++i) {
      const S grad = static_cast<S>(g[i]);
      const S m1 = b1 * m.in[i] + one_minus_b1 * grad;
      const S v1 = b2 * v.in[i] + one_minus_b2 * (grad * grad);
      m.out[i] = m1;
      v.out[i] = v1;
      S weight = static_cast<S>(w.in[i]);
      if constexpr (kDecay) weight = weight - lr_decay * weight;
      weight = weight - corrected_lr * m1 / (std::sqrt(v1) + eps);
      w.out[i] = static_cast<W>(weight);
    }
  }

#if defined(__AVX__)
  // The loop above on 8 floats at a time; returns where the scalar tail starts.
  template <bool kDecay>
  int64_t run_avx(int64_t begin, int64_t end) const {
    const __m256 vb1 = _mm256_set1_ps(b1), vomb1 = _mm256_set1_ps(one_minus_b1);
    const __m256 vb2 = _mm256_set1_ps(b2), vomb2 = _mm256_set1_ps(one_minus_b2);
    const __m256 veps = _mm256_set1_ps(eps), vlr = _mm256_set1_ps(corrected_lr), vdecay = _mm256_set1_ps(lr_decay);
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      const __m256 grad = _mm256_loadu_ps(g + i);
      const __m256 m1 = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m.in + i)), _mm256_mul_ps(vomb1, grad));
      const __m256 v1 = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v.in + i)),
                                      _mm256_mul_ps(vomb2, _mm256_mul_ps(grad, grad)));
      _mm256_storeu_ps(m.out + i, m1);
      _mm256_storeu_ps(v.out + i, v1);
      __m256 weight = _mm256_loadu_ps(w.in + i);
      if constexpr (kDecay) weight = _mm256_sub_ps(weight, _mm256_mul_ps(vdecay, weight));
      const __m256 step = _mm256_div_ps(_mm256_mul_ps(vlr, m1), _mm256_add_ps(_mm256_sqrt_ps(v1), veps));
      _mm256_storeu_ps(w.out + i, _mm256_sub_ps(weight, step));
    }
    return i;
  }
#endif
};

template <class W, class S>
struct SgdRange {
  Stream<W> w;
  const W* g;
  Stream<S> u;  // the velocity; unused without momentum
  S lr, momentum, weight_decay;
  bool has_momentum, nesterov;

  void operator()(int64_t begin, int64_t end) const {
    if (has_momentum) {
      run<true>(begin, end);
    } else {
      run<false>(begin, end);
    }
  }

  template <bool kMomentum>
  void run(int64_t begin, int64_t end) const {
    for (int64_t i = begin; i < end; ++i) {
      S weight = static_cast<S>(w.in[i]);
      const S grad = static_cast<S>(g[i]) + weight_decay * weight;
      S direction = grad;
      if constexpr (kMomentum) {
        const S u1 = momentum * u.in[i] + grad;
        u.out[i] = u1;
        direction = nesterov ? grad + momentum * u1 : u1;
      }
      weight = weight - lr * direction;
      w.out[i] = static_cast<W>(weight);
    }
  }
};

// A state's buffers for one pass: its own when nothing else holds it, else a fresh one (installed
// by commit()), so a reader holding the old value keeps it.
struct Target {
  VariableState* state = nullptr;
  Tensor in, out;

  explicit Target(VariableState* s) : state(s) {
    if (s == nullptr) return;
    if (exclusively_owned(s->value)) {
      in = out = s->value;
    } else {
      in = s->value.contiguous();
      out = Tensor::empty(s->value.shape(), s->value.dtype(), s->value.device());
    }
  }
  template <class T>
  Stream<T> stream() const {
    if (state == nullptr) return {};
    return {static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data())};
  }
  void commit() {
    if (state != nullptr && out.impl_ptr() != state->value.impl_ptr()) state->value = out;
  }
};

const char* rule_name(UpdateRule rule) { return rule == UpdateRule::adam ? "adam" : "sgd"; }

void check_slot(const VariableState& var, const VariableState* slot, const char* which) {
  if (slot == nullptr) fail<InvalidArgument>("optimizer_update: variable '{}' has no {} slot", var.name, which);
  const DType want = slot_dtype(var.value.dtype());
  if (!(slot->value.shape() == var.value.shape()) || slot->value.dtype() != want ||
      slot->value.device() != var.value.device()) {
    fail<ShapeError>("optimizer_update: slot '{}' ({} {} on {}) does not fit variable '{}' ({} {} on {}; wants {} "
                     "slots)",
                     slot->name, slot->value.shape(), slot->value.dtype(), slot->value.device(), var.name,
                     var.value.shape(), var.value.dtype(), var.value.device(), want);
  }
}

// Checks the call against the states (their mutexes held by the caller).
void check_call(const OptimizerUpdateAttrs& a, std::span<const Tensor> inputs, bool symbolic) {
  const VariableState& var = *a.var;
  const int want_inputs = a.rule == UpdateRule::adam ? 2 : 1;
  if (static_cast<int>(inputs.size()) != want_inputs) {
    fail<InvalidArgument>("optimizer_update: {} takes {} inputs; got {}", rule_name(a.rule), want_inputs, inputs.size());
  }
  const Tensor& grad = inputs[0];
  if (!is_floating(var.value.dtype())) {
    fail<DTypeError>("optimizer_update: variable '{}' must have a floating dtype; got {}", var.name, var.value.dtype());
  }
  check_variable_update("optimizer_update", var, grad, /*check_device=*/!symbolic);
  if (a.rule == UpdateRule::adam) {
    check_slot(var, a.slot0.get(), "m");
    check_slot(var, a.slot1.get(), "v");
    const Tensor& count = inputs[1];
    if (count.dtype() != i64 || count.rank() != 0) {
      fail<ShapeError>("optimizer_update: the step counter must be an i64 scalar; got {} {}", count.shape(),
                       count.dtype());
    }
  } else if (a.slot0) {
    check_slot(var, a.slot0.get(), "momentum");
  }
}

void update_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<OptimizerUpdateAttrs>();
  {
    std::lock_guard lock(a.var->mutex);
    std::optional<std::lock_guard<std::mutex>> lock0, lock1;
    if (a.slot0) lock0.emplace(a.slot0->mutex);
    if (a.slot1) lock1.emplace(a.slot1->mutex);
    check_call(a, call.inputs, /*symbolic=*/call.inputs[0].is_symbolic());
    spec.device = a.var->value.device();
  }
  spec.count = 0;
}

template <class W, class S>
void run_typed(const OptimizerUpdateAttrs& a, const Tensor& grad, int64_t count, Target& w, Target& s0, Target& s1) {
  const int64_t n = w.in.numel();
  const W* g = static_cast<const W*>(grad.raw_data());
  if (a.rule == UpdateRule::adam) {
    // The bias correction in S, as the per-op path computes it from the counter (never baked in).
    const S t = static_cast<S>(count) + S(1);
    const S b1 = static_cast<S>(a.beta1), b2 = static_cast<S>(a.beta2);
    const S corrected = static_cast<S>(a.lr) * std::sqrt(S(1) - std::pow(b2, t)) / (S(1) - std::pow(b1, t));
    const AdamRange<W, S> body{w.stream<W>(),
                               g,
                               s0.stream<S>(),
                               s1.stream<S>(),
                               b1,
                               static_cast<S>(1.0 - a.beta1),
                               b2,
                               static_cast<S>(1.0 - a.beta2),
                               static_cast<S>(a.eps),
                               corrected,
                               static_cast<S>(a.lr * a.weight_decay),
                               a.weight_decay > 0.0};
    // About 20 flops and 7 streams per element: worth a second thread sooner than a plain add.
    parallel_for(n, kParallelGrain / 4, body);
  } else {
    const SgdRange<W, S> body{w.stream<W>(),          g, s0.stream<S>(), static_cast<S>(a.lr), static_cast<S>(a.beta1),
                              static_cast<S>(a.weight_decay), a.slot0 != nullptr, a.nesterov};
    parallel_for(n, kParallelGrain / 2, body);
  }
}

void update_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& a = call.attrs<OptimizerUpdateAttrs>();
  const Tensor grad = call.inputs[0].contiguous();
  const int64_t count = a.rule == UpdateRule::adam ? call.inputs[1].item<int64_t>() : 0;
  std::lock_guard lock(a.var->mutex);
  std::optional<std::lock_guard<std::mutex>> lock0, lock1;
  if (a.slot0) lock0.emplace(a.slot0->mutex);
  if (a.slot1) lock1.emplace(a.slot1->mutex);
  check_call(a, call.inputs, /*symbolic=*/false);  // shapes may vary between calls (unknown dimensions)
  Target w(a.var.get()), s0(a.slot0.get()), s1(a.slot1.get());
  switch (a.var->value.dtype()) {
    case f32: run_typed<float, float>(a, grad, count, w, s0, s1); break;
    case f64: run_typed<double, double>(a, grad, count, w, s0, s1); break;
    case f16: run_typed<f16_t, float>(a, grad, count, w, s0, s1); break;
    case bf16: run_typed<bf16_t, float>(a, grad, count, w, s0, s1); break;
    default: fail<DTypeError>("optimizer_update: no kernel for a {} variable '{}'", a.var->value.dtype(), a.var->name);
  }
  w.commit();
  s0.commit();
  s1.commit();
}

ResourceAccess writes_variable(const void* attributes) {
  return {static_cast<const OptimizerUpdateAttrs*>(attributes)->var.get(), /*writes=*/true};
}

std::string update_node_name(const void* attributes) {
  const auto& a = *static_cast<const OptimizerUpdateAttrs*>(attributes);
  return fmt::format("{}_update_{}", rule_name(a.rule), a.var->name.empty() ? "variable" : a.var->name);
}

}  // namespace

std::string OptimizerUpdateAttrs::describe() const {
  return fmt::format(
      "rule={}, variable='{}', slots='{}','{}', lr={}, beta1={}, beta2={}, eps={}, weight_decay={}, nesterov={}",
      rule_name(rule), var->name, slot0 ? slot0->name : "", slot1 ? slot1->name : "", lr, beta1, beta2, eps,
      weight_decay, nesterov);
}

// Stateful (never folded, deduplicated or pruned); ordered on the variable by Op::resource and on
// its slots by optimizer_update() below. CPU only: other devices keep the per-op update.
Op optimizer_update_op{.name = "optimizer_update",
                       .min_inputs = 1,
                       .max_inputs = 2,
                       .flags = kStateful,
                       .infer = &update_infer,
                       .kernels = {&update_kernel},
                       .copy_attributes = &copy_attributes<OptimizerUpdateAttrs>,
                       .describe_attributes = &describe_attributes<OptimizerUpdateAttrs>,
                       .resource = &writes_variable,
                       .node_name = &update_node_name};

bool optimizer_update_applies(const VariableState& var) {
  if (var.mirrors || var.remote) return false;
  std::lock_guard lock(var.mutex);
  return optimizer_update_op.runs_on(var.value.device().kind());
}

void optimizer_update(const OptimizerUpdateAttrs& attrs, const Tensor& grad, const Tensor& count) {
  const std::array<Tensor, 2> inputs{grad, count};
  const std::span<const Tensor> used(inputs.data(), attrs.rule == UpdateRule::adam ? 2 : 1);
  TraceBuilder* const trace = active_trace();
  if (trace == nullptr) {
    // Eagerly: straight to the kernel (no outputs, nothing for a tape to record), after the same
    // checks, so a bad call changes nothing.
    const OpCall call{optimizer_update_op, used, &attrs};
    OutputSpec spec;
    update_infer(call, spec);
    update_kernel(call, {});
    return;
  }
  dispatch_all(optimizer_update_op, used, &attrs);
  const auto node = static_cast<int32_t>(trace->graph().nodes().size() - 1);
  Node& recorded = trace->graph().node(node);
  if (recorded.op != &optimizer_update_op) fail<InvalidArgument>("optimizer_update: its node was not recorded last");
  // The placer runs it where the variable lives (like the variable's own reads and updates).
  recorded.colocate_with = attrs.var.get();
  // Ordered on the slots too: a read of a slot elsewhere in the step sees this update's value.
  if (attrs.slot0) trace->order_effect(node, attrs.slot0.get(), /*writes=*/true);
  if (attrs.slot1) trace->order_effect(node, attrs.slot1.get(), /*writes=*/true);
}

}  // namespace flowlet::detail
