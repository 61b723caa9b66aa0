// Where a server variable lives: which servers hold which of its rows. Computed once per variable,
// in creation order, identically on every process (it depends only on the variable's shape, dtype
// and creation index and on the policy), so workers and servers agree without a message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flowlet/core/dtype.hpp"
#include "flowlet/core/shape.hpp"
#include "flowlet/ps_options.hpp"

namespace flowlet::detail::ps {

// Rows [row_begin, row_end) of a variable, held by `server` (a rank-0 variable has one row).
struct ShardPiece {
  int server = 0;
  int64_t row_begin = 0, row_end = 0;
  int64_t rows() const { return row_end - row_begin; }
};

struct VariablePlacement {
  int32_t id = 0;  // the variable's creation index among the strategy's server variables
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  std::vector<ShardPiece> pieces;  // ordered by row_begin, covering every row exactly once

  int64_t rows() const { return shape.rank() == 0 ? 1 : shape[0]; }
  int64_t row_elements() const {  // elements per row
    int64_t n = 1;
    for (int64_t d = 1; d < shape.rank(); ++d) n *= shape[d];
    return n;
  }
  // The piece holding `row` (0 <= row < rows()).
  const ShardPiece& piece_of_row(int64_t row) const {
    auto it = std::upper_bound(pieces.begin(), pieces.end(), row,
                               [](int64_t r, const ShardPiece& p) { return r < p.row_begin; });
    return *(it - 1);
  }
  // The piece `server` holds, or null.
  const ShardPiece* piece_on(int server) const {
    for (const ShardPiece& p : pieces) {
      if (p.server == server) return &p;
    }
    return nullptr;
  }
};

// Places variables one after another (creation order) over `num_servers` servers.
class Placer {
 public:
  Placer(int num_servers, ShardingPolicy policy) : num_servers_(num_servers), policy_(policy) {}

  VariablePlacement place(int32_t id, std::string name, const Shape& shape, DType dtype) {
    VariablePlacement p{id, std::move(name), shape, dtype, {}};
    const int64_t rows = p.rows();
    const int64_t bytes = shape.numel() * static_cast<int64_t>(dtype_size(dtype));
    int shards = policy_.max_shards > 0 ? std::min(policy_.max_shards, num_servers_) : num_servers_;
    shards = static_cast<int>(std::min<int64_t>(shards, rows));
    if (shape.rank() >= 1 && rows >= 2 && shards >= 2 && bytes >= policy_.min_bytes_to_split) {
      int64_t begin = 0;
      for (int s = 0; s < shards; ++s) {
        const int64_t take = rows / shards + (s < rows % shards ? 1 : 0);
        p.pieces.push_back({s, begin, begin + take});
        begin += take;
      }
    } else {
      p.pieces.push_back({next_whole_, 0, rows});
      next_whole_ = (next_whole_ + 1) % num_servers_;
    }
    return p;
  }

 private:
  int num_servers_;
  ShardingPolicy policy_;
  int next_whole_ = 0;
};

}  // namespace flowlet::detail::ps
