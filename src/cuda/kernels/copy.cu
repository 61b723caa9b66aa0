// Kernels that move or convert elements without arithmetic: copy, cast and where.
#include "cuda/kernels/elementwise.cuh"

namespace flowlet::detail::cuda {
namespace {

struct Identity {
  template <class T>
  __device__ T operator()(T x) const { return x; }
};

struct Select {
  template <class T>
  __device__ T operator()(bool condition, T a, T b) const { return condition ? a : b; }
};

}  // namespace

void launch_copy(const ElementwiseArgs& args, int bytes, const Launch& where) {
  visit_bits("copy", bytes, [&]<class U>(TypeTag<U>) { launch_map<U, U>("copy", args, Identity{}, where); });
}

void launch_where(const ElementwiseArgs& args, int bytes, const Launch& where) {
  visit_bits("where", bytes, [&]<class U>(TypeTag<U>) { launch_map<U, bool, U, U>("where", args, Select{}, where); });
}

// Loads as From's compute type; map_kernel's store converts to To with the CPU's rules.
void launch_cast(const ElementwiseArgs& args, ElementType to, ElementType from, const Launch& where) {
  visit_type<kAll>("cast", to, [&]<class To>(TypeTag<To>) {
    visit_type<kAll>("cast", from, [&]<class From>(TypeTag<From>) {
      launch_map<To, From>("cast", args, Identity{}, where);
    });
  });
}

}  // namespace flowlet::detail::cuda
