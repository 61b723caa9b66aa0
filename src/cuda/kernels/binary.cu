// Binary elementwise kernels: arithmetic (wrapping for integers, as on the CPU), pow, maximum and
// minimum (NaN wins), and comparisons (b8 out). The launcher list names each op once.
#include "cuda/kernels/elementwise.cuh"

namespace flowlet::detail::cuda {
namespace {

template <class T>
inline constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Integer arithmetic in the unsigned type: two's-complement wrap, no undefined overflow.
template <class T, class F>
__device__ T wrapping(T a, T b, F f) {
  if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(f(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return f(a, b);
  }
}

struct Add {
  template <class T>
  __device__ T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x + y); }); }
};
struct Sub {
  template <class T>
  __device__ T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x - y); }); }
};
struct Mul {
  template <class T>
  __device__ T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x * y); }); }
};
// Integer division by zero marks `error` (the host then throws InvalidArgument, as the CPU does) and
// yields 0; INT_MIN / -1 wraps.
struct Div {
  uint64_t* error = nullptr;
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) {
        if (error) *error = 0;
        return T{0};
      }
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return wrapping(T{0}, a, [](auto x, auto y) { return static_cast<decltype(x)>(x - y); });
      }
    }
    return a / b;
  }
};
struct Pow {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, float>) return powf(a, b);
    else return pow(a, b);
  }
};
struct Maximum {
  template <class T>
  __device__ T operator()(T a, T b) const { return ((a > b) | (a != a)) ? a : b; }
};
struct Minimum {
  template <class T>
  __device__ T operator()(T a, T b) const { return ((a < b) | (a != a)) ? a : b; }
};
struct Equal {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a == b; }
};
struct NotEqual {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a != b; }
};
struct Less {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a < b; }
};
struct LessEqual {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a <= b; }
};
struct Greater {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a > b; }
};
struct GreaterEqual {
  template <class T>
  __device__ bool operator()(T a, T b) const { return a >= b; }
};

template <class F>
F make_functor(uint64_t* error) {
  if constexpr (requires { F{error}; }) return F{error};
  else return F{};
}

// Arithmetic keeps the input type; comparisons write bool.
template <class F, unsigned Allowed, bool Comparison>
void launch_binary(const ElementwiseArgs& args, ElementType type, const Launch& where, uint64_t* error) {
  visit_type<Allowed>("binary", type, [&]<class T>(Tag<T>) {
    using Out = std::conditional_t<Comparison, bool, T>;
    launch_map<Out, T, T>("binary", args, make_functor<F>(error), where);
  });
}

constexpr NamedLauncher kBinary[] = {
    {"add", &launch_binary<Add, kNumberTypes, false>},
    {"sub", &launch_binary<Sub, kNumberTypes, false>},
    {"mul", &launch_binary<Mul, kNumberTypes, false>},
    {"div", &launch_binary<Div, kNumberTypes, false>},
    {"pow", &launch_binary<Pow, kFloatingTypes, false>},
    {"maximum", &launch_binary<Maximum, kNumberTypes, false>},
    {"minimum", &launch_binary<Minimum, kNumberTypes, false>},
    {"equal", &launch_binary<Equal, kAllTypes, true>},
    {"not_equal", &launch_binary<NotEqual, kAllTypes, true>},
    {"less", &launch_binary<Less, kAllTypes, true>},
    {"less_equal", &launch_binary<LessEqual, kAllTypes, true>},
    {"greater", &launch_binary<Greater, kAllTypes, true>},
    {"greater_equal", &launch_binary<GreaterEqual, kAllTypes, true>},
    {nullptr, nullptr},
};

}  // namespace

const NamedLauncher* binary_launchers() { return kBinary; }

}  // namespace flowlet::detail::cuda
