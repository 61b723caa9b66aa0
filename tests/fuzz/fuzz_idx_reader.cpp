// libFuzzer target: the IDX reader (load_idx_images_and_labels) on arbitrary bytes, gzip or plain.
//
// An input is a 2-byte big-endian length n, then n bytes of images file (fewer if the input ends),
// then the labels file: mutations can move bytes between the two, so both readers see every kind
// of header. Invariants: the call returns or throws a flowlet::Error (anything else, a crash or a
// sanitizer report is a finding), and a returned dataset holds images [N, pixels] and labels [N].
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <flowlet/flowlet.hpp>

#include "memory_file.hpp"

namespace fl = flowlet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile images("fuzz_idx_images"), labels("fuzz_idx_labels");
  if (size < 2) return 0;
  const size_t images_bytes = std::min<size_t>((size_t{data[0]} << 8) | data[1], size - 2);
  images.write(data + 2, images_bytes);
  labels.write(data + 2 + images_bytes, size - 2 - images_bytes);
  try {
    const fl::data::Dataset dataset = fl::data::load_idx_images_and_labels(images.path(), labels.path());
    if (dataset.images.rank() != 2 || dataset.labels.rank() != 1 ||
        dataset.images.shape()[0] != dataset.labels.shape()[0])
      std::abort();
  } catch (const fl::Error&) {
  }
  return 0;
}
