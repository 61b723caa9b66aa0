// Where a product split over the pool cuts its rows (or columns): the piece edges, a pure function
// of the extent and the thread count, so a split product is the same on every run at a given
// thread count (each piece is one single-threaded BLAS call over the full k, whichever thread takes
// it). Pieces are claimed in order from the pool's counter (run_chunks), so a worker that starts
// late, or is descheduled after claiming, holds back at most one piece. Two even halves leave the
// caller waiting for half the product whenever the worker claims its half late (docs/notes20/gemm.md,
// docs/notes21/gemm.md); guided pieces (each a quarter of what is left at two threads) keep the
// late worker's share small. Each piece packs the shared operand again, so no piece is shorter than
// `min_piece` (measured: 64-row pieces of 784 x 256 cost 0-6% over one call, 16-row ones 30-60%).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace flowlet::detail {

// Up to kMaxGemmPieces pieces; edges[0] = 0, edges[count] = extent, every piece non-empty, every
// inner edge a multiple of `align`.
inline constexpr int64_t kMaxGemmPieces = 32;
struct GemmPieces {
  std::array<int64_t, kMaxGemmPieces + 1> edges{};
  int64_t count = 0;
};

// `extent` cut into `parts` near-equal pieces (at most extent / align of them, at least one),
// every inner edge rounded down to a multiple of `align`.
inline GemmPieces even_gemm_pieces(int64_t extent, int64_t parts, int64_t align) {
  GemmPieces p;
  if (extent <= 0) return p;
  align = std::max<int64_t>(align, 1);
  const int64_t count = std::clamp<int64_t>(parts, 1, std::clamp<int64_t>(extent / align, 1, kMaxGemmPieces));
  for (int64_t j = 1; j < count; ++j) p.edges[j] = extent * j / count / align * align;
  p.edges[count] = extent;
  p.count = count;
  return p;
}

// `parts` threads share `extent` rows. Below 2 * parts * min_piece rows (where guided pieces
// could not all be min_piece long) the even pieces above. Otherwise each piece takes
// 1 / (2 * parts) of the rows still left, rounded up to `align`, at least min_piece (itself
// rounded up to `align`, so that every inner edge stays on it); a rest shorter than min_piece
// joins the last piece.
inline GemmPieces guided_gemm_pieces(int64_t extent, int64_t parts, int64_t align, int64_t min_piece) {
  align = std::max<int64_t>(align, 1);
  min_piece = (std::max(min_piece, align) + align - 1) / align * align;
  parts = std::clamp<int64_t>(parts, 1, kMaxGemmPieces);
  if (extent < 2 * parts * min_piece) return even_gemm_pieces(extent, parts, align);
  GemmPieces p;
  int64_t at = 0;
  while (at < extent) {
    const int64_t left = extent - at;
    int64_t size = std::max(min_piece, (left / (2 * parts) + align - 1) / align * align);
    if (left - size < min_piece || p.count + 1 == kMaxGemmPieces) size = left;
    at += size;
    p.edges[++p.count] = at;
  }
  return p;
}

}  // namespace flowlet::detail
