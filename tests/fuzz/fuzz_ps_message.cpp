// libFuzzer target: the parameter-server message decoder (src/ps/wire/messages.cpp) on arbitrary
// bytes, as a receiving server or worker sees them.
//
// Invariants: decode() returns or throws DataLoss (anything else, a crash or a sanitizer report is
// a finding), and what it returns encodes back to exactly the input (the format has one encoding
// per message, so a decoder that accepts more, or reads a field wrongly, shows up here).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include <flowlet/flowlet.hpp>

#include "ps/wire/messages.hpp"

namespace ps = flowlet::detail::ps;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const ps::Message message = ps::decode(bytes);
    const ps::Bytes again = ps::encode(message);
    if (again.size() != size || (size > 0 && std::memcmp(again.data(), data, size) != 0)) std::abort();
  } catch (const flowlet::DataLoss&) {
  }
  return 0;
}
