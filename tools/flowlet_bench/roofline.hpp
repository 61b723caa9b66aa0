// This machine's roofline for flowlet-bench's roofline_pct: peak memory bandwidth (a STREAM triad
// over 3 x 64 MB) and peak FLOP/s (independent OpenBLAS sgemm and dgemm calls, one per thread of
// the budget, as flowlet's matmul runs them), measured once and cached per CPU model and thread
// count in $XDG_CACHE_HOME/flowlet/roofline.json (else ~/.cache/flowlet/roofline.json).
#pragma once

#include <string>

namespace flowlet_bench {

struct Roofline {
  std::string key;                // "<cpu model>|threads=<n>"
  double bytes_per_second = 0;    // triad: 2 reads + 1 write per element
  double sgemm_flops = 0;         // f32 (and the f16/bf16 compute type)
  double dgemm_flops = 0;         // f64
  bool from_cache = false;
  std::string cache_path;
};

// The cached figures for this machine and thread budget, measured now when absent or when
// `recalibrate` (then written back). A cache that cannot be written is only a warning.
Roofline load_or_measure_roofline(int threads, bool recalibrate);

}  // namespace flowlet_bench
