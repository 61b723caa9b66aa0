// The order in which interleaved benchmark rounds run their contenders: a balanced Latin square
// (Williams design), so that over a full cycle of rounds every contender runs in every position
// equally often AND directly after every other contender equally often. A plain rotation gives
// each contender always the same predecessor (0 after n-1), so whatever one contender leaves
// behind (libtorch's OpenMP threads still spinning, a cache full of its weights) always lands on
// the same other one, and that order effect reads as a difference between them.
//
//   for (int r = 0; r < rounds; ++r)
//     for (size_t c : flowlet_bench::round_order(contenders.size(), r)) time(contenders[c]);
//
// A full cycle is round_order_cycle(n) rounds: n for an even n, 2n for an odd one (each row and
// its reverse).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace flowlet_bench {

inline size_t round_order_cycle(size_t n) { return n <= 1 ? 1 : n % 2 == 0 ? n : 2 * n; }

inline std::vector<size_t> round_order(size_t n, int round) {
  std::vector<size_t> order(n);
  if (n == 0) return order;
  // First row 0, 1, n-1, 2, n-2, ...; row r adds r to each entry (mod n).
  std::vector<size_t> first{0};
  for (size_t k = 1; first.size() < n; ++k) {
    first.push_back(k);
    if (first.size() < n) first.push_back(n - k);
  }
  const size_t row = static_cast<size_t>(round) % round_order_cycle(n);
  const size_t shift = row % n;
  for (size_t j = 0; j < n; ++j) order[j] = (first[j] + shift) % n;
  if (row >= n) std::reverse(order.begin(), order.end());  // odd n: the second half reverses the rows
  return order;
}

}  // namespace flowlet_bench
