// 16-bit floating-point storage types (IEEE binary16 and bfloat16) with exact conversions to and from float.
#pragma once

#include <bit>
#include <cstdint>

namespace flowlet {

// IEEE 754 binary16. A storage type: arithmetic converts to float.
struct f16_t {
  uint16_t bits = 0;

  f16_t() = default;
  explicit f16_t(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  friend bool operator==(f16_t a, f16_t b) { return float(a) == float(b); }

  // Round to nearest even; overflow gives infinity, NaN stays NaN.
  static uint16_t from_float(float value) {
    const uint32_t x = std::bit_cast<uint32_t>(value);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 2^16 and above: infinity
    if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
      // Adding 0.5f aligns the half's subnormal step (2^-24) to the float's last mantissa bit.
      const float shifted = std::bit_cast<float>(abs) + 0.5f;
      return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
    }
    const uint32_t odd = (abs >> 13) & 1u;
    const uint32_t rounded = abs + 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: value = mantissa * 2^-24
      const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
      return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
    }
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
};

// bfloat16: the upper half of a float. A storage type: arithmetic converts to float.
struct bf16_t {
  uint16_t bits = 0;

  bf16_t() = default;
  explicit bf16_t(float value) : bits(from_float(value)) {}
  explicit operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  friend bool operator==(bf16_t a, bf16_t b) { return float(a) == float(b); }

  // Round to nearest even; NaN stays a (quiet) NaN.
  static uint16_t from_float(float value) {
    const uint32_t x = std::bit_cast<uint32_t>(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
};

}  // namespace flowlet
