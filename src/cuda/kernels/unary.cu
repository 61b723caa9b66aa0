// Unary elementwise kernels: neg, abs, square and relu on every number type; exp, log, sqrt, tanh
// and sigmoid on floating types (f16 and bf16 computed in float). The launcher list names each op once.
#include "cuda/kernels/elementwise.cuh"

namespace flowlet::detail::cuda {
namespace {

template <class T>
inline constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;

struct Neg {
  template <class T>
  __device__ T operator()(T a) const {
    if constexpr (kWraps<T>) return static_cast<T>(std::make_unsigned_t<T>{0} - static_cast<std::make_unsigned_t<T>>(a));
    else return -a;
  }
};
struct Abs {
  template <class T>
  __device__ T operator()(T a) const {
    if constexpr (std::is_unsigned_v<T>) return a;
    else return a < T{0} ? Neg{}(a) : a;
  }
};
struct Square {
  template <class T>
  __device__ T operator()(T a) const {
    if constexpr (kWraps<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(a)));
    } else {
      return a * a;
    }
  }
};
struct Relu {
  template <class T>
  __device__ T operator()(T a) const { return a > T{0} ? a : T{0}; }
};
struct Exp {
  __device__ float operator()(float a) const { return expf(a); }
  __device__ double operator()(double a) const { return exp(a); }
};
struct Log {
  __device__ float operator()(float a) const { return logf(a); }
  __device__ double operator()(double a) const { return log(a); }
};
struct Sqrt {
  __device__ float operator()(float a) const { return sqrtf(a); }
  __device__ double operator()(double a) const { return sqrt(a); }
};
struct Tanh {
  __device__ float operator()(float a) const { return tanhf(a); }
  __device__ double operator()(double a) const { return tanh(a); }
};
struct Sigmoid {  // never exponentiates a large positive number
  template <class T>
  __device__ T operator()(T a) const {
    if (a >= T{0}) return T{1} / (T{1} + Exp{}(-a));
    const T e = Exp{}(a);
    return e / (T{1} + e);
  }
};

template <class F, unsigned Allowed>
void launch_unary(const ElementwiseArgs& args, ElementType type, const Launch& where, uint64_t*) {
  visit_type<Allowed>("unary", type, [&]<class T>(Tag<T>) { launch_map<T, T>("unary", args, F{}, where); });
}

constexpr NamedLauncher kUnary[] = {
    {"neg", &launch_unary<Neg, kNumberTypes>},
    {"abs", &launch_unary<Abs, kNumberTypes>},
    {"square", &launch_unary<Square, kNumberTypes>},
    {"relu", &launch_unary<Relu, kNumberTypes>},
    {"exp", &launch_unary<Exp, kFloatingTypes>},
    {"log", &launch_unary<Log, kFloatingTypes>},
    {"sqrt", &launch_unary<Sqrt, kFloatingTypes>},
    {"tanh", &launch_unary<Tanh, kFloatingTypes>},
    {"sigmoid", &launch_unary<Sigmoid, kFloatingTypes>},
    {nullptr, nullptr},
};

}  // namespace

const NamedLauncher* unary_launchers() { return kUnary; }

}  // namespace flowlet::detail::cuda
