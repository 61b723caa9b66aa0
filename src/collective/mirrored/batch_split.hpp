// How run() shares a batch over the replicas: B rows over R replicas, replica r gets B / R rows and
// the first B mod R replicas one more, in replica order (so the rows keep their order overall).
#pragma once

#include <cstdint>

namespace flowlet::detail {

struct RowShare {
  int64_t start = 0;  // first row of the replica's share
  int64_t rows = 0;   // may be 0 when B < R
};

inline RowShare row_share(int64_t batch_rows, int replicas, int replica) {
  const int64_t base = batch_rows / replicas, extra = batch_rows % replicas;
  const int64_t r = replica;
  return RowShare{r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

}  // namespace flowlet::detail
