// packed_sgemm: the packed-panel f32 GEMM driver (see gemm_packed.hpp): blocking, packing, tiles.
#include "kernels/gemm_packed.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "kernels/gemm_microkernel_avx2.hpp"
#include "kernels/gemm_pack_avx2.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

int64_t round_up(int64_t x, int64_t step) { return (x + step - 1) / step * step; }
int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// A 64-byte aligned float buffer that keeps its memory between calls (packing buffers would
// otherwise be fresh pages, faulted in on every call).
struct PackBuffer {
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], Free> data;
  int64_t size = 0;
  bool in_use = false;
  float* reserve(int64_t floats) {
    if (floats > size) {
      data.reset(static_cast<float*>(::operator new[](static_cast<size_t>(floats) * sizeof(float), std::align_val_t{64})));
      size = floats;
    }
    return data.get();
  }
};

// The k blocks: k cut into ceil(k / kPackedKc) blocks of equal depth (within one).
struct DepthBlocks {
  int64_t count;
  int64_t k;
  int64_t begin(int64_t i) const { return k * i / count; }
};

// Packs op(B)'s columns [16 s, 16 s + 16) (zeros past n) for rows [p0, p1) into dst, k-major.
void pack_b_sliver(bool transpose_b, const float* b, int64_t ldb, int64_t n, int64_t s, int64_t p0, int64_t p1,
                   float* dst) {
  const int64_t j0 = s * kMicroColumns, cols = std::min<int64_t>(kMicroColumns, n - j0);
  if (!transpose_b) {
    for (int64_t p = p0; p < p1; ++p, dst += kMicroColumns) {
      const float* row = b + p * ldb + j0;
      if (cols == kMicroColumns) {
        std::memcpy(dst, row, sizeof(float) * kMicroColumns);
      } else {
        for (int64_t j = 0; j < kMicroColumns; ++j) dst[j] = j < cols ? row[j] : 0.0f;
      }
    }
    return;
  }
  // B stored [n, k]: column j of op(B) is stored row j, read along k.
  const int64_t depth = p1 - p0;
  for (int64_t j = 0; j < kMicroColumns; ++j) {
    if (j < cols) {
      const float* stored = b + (j0 + j) * ldb + p0;
      for (int64_t p = 0; p < depth; ++p) dst[p * kMicroColumns + j] = stored[p];
    } else {
      for (int64_t p = 0; p < depth; ++p) dst[p * kMicroColumns + j] = 0.0f;
    }
  }
}

// Packs op(A)'s rows [i0, i1) for k rows [p0, p1) into 6-row slivers (zeros past i1), k-major.
void pack_a_block(bool transpose_a, const float* a, int64_t lda, int64_t i0, int64_t i1, int64_t p0, int64_t p1,
                  float* dst) {
  const int64_t depth = p1 - p0;
  for (int64_t r0 = i0; r0 < i1; r0 += kMicroRows, dst += depth * kMicroRows) {
    const int64_t rows = std::min<int64_t>(kMicroRows, i1 - r0);
    if (transpose_a) {  // A stored [k, m]: the sliver's rows lie side by side in each stored row
      for (int64_t p = 0; p < depth; ++p) {
        const float* stored = a + (p0 + p) * lda + r0;
        float* out = dst + p * kMicroRows;
        for (int64_t i = 0; i < kMicroRows; ++i) out[i] = i < rows ? stored[i] : 0.0f;
      }
    } else {  // six stored rows read along k, turned k-major in registers
      pack_a_rows_6_avx2(a + r0 * lda + p0, lda, static_cast<int>(rows), depth, dst);
    }
  }
}

// The tiles of C: row blocks of `mc` rows (a multiple of 6) times column blocks of `nc` columns (a
// multiple of 16). At one thread the largest that fit the caches; with more, cut finer until there
// are about kTilesPerThread tiles per thread (a late or slowed thread then holds back little),
// halving the longer side, no tile under 24 rows or 64 columns. 8 per thread ran 128x784x256 and
// 784x128x256 (A^T) at 476 / 380 us against 865 / 460 with 4 and 816 / 950 with 1 (16:14, load 1.5,
// bench_gemm_pieces; noisy, but 8 was fastest in each).
constexpr int64_t kTilesPerThread = 8;
struct Tiles {
  int64_t mc, nc, row_blocks, column_blocks;
  int64_t count() const { return row_blocks * column_blocks; }
};

Tiles choose_tiles(int64_t m, int64_t n, int threads) {
  int64_t rb = ceil_div(m, kPackedMcMax), cb = ceil_div(n, kPackedNcMax);
  const int64_t wanted = threads > 1 ? kTilesPerThread * static_cast<int64_t>(threads) : 1;
  while (rb * cb < wanted) {
    const int64_t rows = ceil_div(m, rb), cols = ceil_div(n, cb);
    const bool rows_can = rows >= 48, cols_can = cols >= 128;
    if (rows_can && (!cols_can || rows * 2 >= cols)) rb *= 2;
    else if (cols_can) cb *= 2;
    else break;
  }
  Tiles t;
  t.mc = round_up(ceil_div(m, rb), kMicroRows);
  t.nc = round_up(ceil_div(n, cb), kMicroColumns);
  t.row_blocks = ceil_div(m, t.mc);
  t.column_blocks = ceil_div(n, t.nc);
  return t;
}

thread_local PackBuffer tile_buffer;    // a tile's own packing, used only inside the tile
thread_local PackBuffer shared_buffer;  // the calling thread's shared operand, unless a call on it runs

// The macro-kernel: C rows [i0, i1) x columns [j0, j1) from one k block (depth kc) of packed A
// slivers (the first one that of row i0) and packed B slivers (the first that of column j0), B
// slivers outside (each kept in L1 over the A slivers, which stream from L2).
void macro_kernel(int64_t kc, const float* a_slivers, const float* b_slivers, int64_t i0, int64_t i1, int64_t j0,
                  int64_t j1, float alpha, float beta, float* c, int64_t ldc) {
  for (int64_t j = j0; j < j1; j += kMicroColumns, b_slivers += kc * kMicroColumns) {
    const int cols = static_cast<int>(std::min<int64_t>(kMicroColumns, j1 - j));
    const float* a_sliver = a_slivers;
    for (int64_t i = i0; i < i1; i += kMicroRows, a_sliver += kc * kMicroRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMicroRows, i1 - i));
      sgemm_microkernel_6x16(kc, a_sliver, b_slivers, alpha, beta, c + i * ldc + j, ldc, rows, cols);
    }
  }
}

// The calling thread's buffer for the operand the tiles share (or a fresh one, freed after the call,
// when a call on this thread is already using it, since a waiting caller may run another product's
// task, or when the operand is larger than a thread should keep: 4M floats, 16 MiB).
inline constexpr int64_t kKeptSharedFloats = int64_t{1} << 22;
class SharedPack {
 public:
  explicit SharedPack(int64_t floats)
      : buffer_(shared_buffer.in_use || floats > kKeptSharedFloats ? own_ : shared_buffer) {
    buffer_.in_use = true;
    data_ = buffer_.reserve(floats);
  }
  ~SharedPack() { buffer_.in_use = false; }
  SharedPack(const SharedPack&) = delete;
  SharedPack& operator=(const SharedPack&) = delete;
  float* data() const { return data_; }

 private:
  PackBuffer own_;
  PackBuffer& buffer_;
  float* data_ = nullptr;
};

// Runs body(0 .. chunks - 1): over the pool when pooled, else in order on this thread.
template <class Body>
void for_chunks(bool pooled, int64_t chunks, Body& body) {
  if (pooled && chunks > 1) run_chunks(chunks, FunctionRef<void(int64_t)>(body));
  else for (int64_t t = 0; t < chunks; ++t) body(t);
}

// Packs the shared operand, slivers [0, slivers), split over the pool (run_chunks returns when all
// chunks are done: the barrier before the tiles): pack(s0, s1, p0, p1) packs slivers [s0, s1) of
// the k block [p0, p1).
template <class Pack>
void pack_shared(bool pooled, int threads, const DepthBlocks& depth, int64_t slivers, Pack pack) {
  const int64_t chunks = pooled ? std::min<int64_t>(slivers, 2 * static_cast<int64_t>(threads)) : 1;
  auto chunk = [&](int64_t q) {
    const int64_t s0 = slivers * q / chunks, s1 = slivers * (q + 1) / chunks;
    for (int64_t d = 0; d < depth.count; ++d) pack(s0, s1, depth.begin(d), depth.begin(d + 1));
  };
  for_chunks(pooled, chunks, chunk);
}

// One call's arguments, as packed_sgemm takes them, and its k blocks.
struct Product {
  bool transpose_a, transpose_b;
  int64_t m, n;
  DepthBlocks depth;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
  int threads;
};

// Packs op(B)'s slivers [s0, s1) of the k block [p0, p1) one after another from dst.
void pack_b_slivers(const Product& p, int64_t s0, int64_t s1, int64_t p0, int64_t p1, float* dst) {
  for (int64_t s = s0; s < s1; ++s, dst += (p1 - p0) * kMicroColumns) {
    pack_b_sliver(p.transpose_b, p.b, p.ldb, p.n, s, p0, p1, dst);
  }
}

// Few rows (m <= kPackedMcMax): A is the small operand every column block shares, so A is packed
// once (split over the pool) and the tiles are column blocks over all rows, each packing its own
// B columns, which no other tile needs: nothing is packed twice.
void packed_sgemm_by_columns(const Product& p) {
  const auto& [transpose_a, transpose_b, m, n, depth, alpha, a, lda, b, ldb, beta, c, ldc, threads] = p;
  const int64_t row_slivers = ceil_div(m, kMicroRows), m_padded = row_slivers * kMicroRows;
  // Packed A: k block d starts at begin(d) * m_padded, its 6-row slivers one after another.
  const SharedPack packed_a(depth.k * m_padded);
  const bool pooled = threads > 1;
  pack_shared(pooled, threads, depth, row_slivers, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    pack_a_block(transpose_a, a, lda, r0 * kMicroRows, std::min(m, r1 * kMicroRows), p0, p1,
                 packed_a.data() + p0 * m_padded + r0 * kMicroRows * (p1 - p0));
  });
  const int64_t wanted = pooled ? kTilesPerThread * static_cast<int64_t>(threads) : 1;
  const int64_t nc = std::min(kPackedNcMax, round_up(ceil_div(n, wanted), kMicroColumns));
  auto tile = [&](int64_t t) {
    const int64_t j0 = t * nc, j1 = std::min(n, j0 + nc);
    float* packed_b = tile_buffer.reserve(nc * kPackedKc);
    for (int64_t d = 0; d < depth.count; ++d) {
      const int64_t p0 = depth.begin(d), p1 = depth.begin(d + 1), kc = p1 - p0;
      pack_b_slivers(p, j0 / kMicroColumns, ceil_div(j1, kMicroColumns), p0, p1, packed_b);
      macro_kernel(kc, packed_a.data() + p0 * m_padded, packed_b, 0, m, j0, j1, alpha, d == 0 ? beta : 1.0f, c, ldc);
    }
  };
  for_chunks(pooled, ceil_div(n, nc), tile);
}

// Many rows: B is packed once (split over the pool), then the tiles (row blocks x column blocks,
// choose_tiles) each pack their own A block and run over the shared B.
void packed_sgemm_by_tiles(const Product& p) {
  const auto& [transpose_a, transpose_b, m, n, depth, alpha, a, lda, b, ldb, beta, c, ldc, threads] = p;
  const int64_t slivers = ceil_div(n, kMicroColumns), n_padded = slivers * kMicroColumns;
  // Packed B: k block d starts at begin(d) * n_padded; its sliver s at s * depth_d * 16 after that.
  const SharedPack packed_b(depth.k * n_padded);
  const bool pooled = threads > 1;
  pack_shared(pooled, threads, depth, slivers, [&](int64_t s0, int64_t s1, int64_t p0, int64_t p1) {
    pack_b_slivers(p, s0, s1, p0, p1, packed_b.data() + p0 * n_padded + s0 * (p1 - p0) * kMicroColumns);
  });
  const Tiles tiles = choose_tiles(m, n, pooled ? threads : 1);
  auto tile = [&](int64_t t) {
    const int64_t i0 = t / tiles.column_blocks * tiles.mc, i1 = std::min(m, i0 + tiles.mc);
    const int64_t j0 = t % tiles.column_blocks * tiles.nc, j1 = std::min(n, j0 + tiles.nc);
    float* packed_a = tile_buffer.reserve(tiles.mc * kPackedKc);
    for (int64_t d = 0; d < depth.count; ++d) {
      const int64_t p0 = depth.begin(d), p1 = depth.begin(d + 1), kc = p1 - p0;
      pack_a_block(transpose_a, a, lda, i0, i1, p0, p1, packed_a);
      macro_kernel(kc, packed_a, packed_b.data() + p0 * n_padded + (j0 / kMicroColumns) * kc * kMicroColumns, i0, i1,
                   j0, j1, alpha, d == 0 ? beta : 1.0f, c, ldc);
    }
  };
  for_chunks(pooled, tiles.count(), tile);
}

}  // namespace

bool packed_sgemm_supported() { return sgemm_microkernel_supported(); }

bool packed_sgemm_pays(int64_t m, int64_t n, int64_t k, bool /*transpose_a*/, bool /*transpose_b*/, int64_t threads) {
  return threads >= 2 && m >= 256 && n >= 64 && k >= 32 && k <= 512 && packed_sgemm_supported();
}

void packed_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads) {
  // Each tile sums k block by block, in order, into its own C: the bits depend on k alone.
  const Product product{transpose_a, transpose_b, m, n, DepthBlocks{ceil_div(k, kPackedKc), k}, alpha, a, lda, b,
                        ldb, beta, c, ldc, threads};
  if (m <= kPackedMcMax) packed_sgemm_by_columns(product);
  else packed_sgemm_by_tiles(product);
}

}  // namespace flowlet::detail
