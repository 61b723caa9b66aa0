// Signatures of traced calls: matching a call against a cached signature (unknown dimensions
// included), hashing for the cache's lookup, the unknown dimensions they declare, and the retrace
// diff that says what changed.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "flowlet/trace.hpp"

namespace flowlet::detail {

using Signature = std::vector<ArgSignature>;

// Whether a call with `call` can run the graph traced for `cached`. An unknown dimension (-1 in
// `cached`) matches every size from 2 up; sizes 0 and 1 broadcast differently, so they get graphs
// of their own.
bool matches(const Signature& cached, const Signature& call);

// A hash consistent with exact equality. A cached signature with unknown dimensions is found by
// hashing the call's generalized signature (generalize()).
size_t signature_hash(const Signature& signature);

// The unknown dimensions `options` declares, as (argument, dimension >= 0), checked against
// `signature` (InvalidArgument names the bad one).
std::vector<std::pair<size_t, size_t>> unknown_dimensions(const TraceOptions& options, const Signature& signature);

// `signature` with every dimension in `dims` unknown (-1), when all of them are 2 or more (what a
// graph that serves every size would be cached under); false when some is 0 or 1.
bool generalize(Signature& signature, const std::vector<std::pair<size_t, size_t>>& dims);

// What differs between a cached signature and a new one, one phrase per changed argument
// ("argument 0: shape [8, 5] -> [16, 5]").
std::vector<std::string> signature_differences(const Signature& before, const Signature& now);

// A shape as signatures print it: unknown dimensions as '?'.
std::string signature_shape_text(const Shape& shape);

}  // namespace flowlet::detail
