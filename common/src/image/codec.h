// SPDX-License-Identifier: Apache-2.0
// Compression of single chunks (internal to the image layer).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "phos/image/format.h"

namespace phos::image::detail {

// Compresses `raw` with `codec` into `out` (resized). Returns the codec actually
// used: kNone when compression would not make the chunk smaller; then `out` is
// left empty and the caller stores `raw` itself (no copy).
Result<Codec> compress(Codec codec, int zstdLevel, std::span<const std::byte> raw,
                       std::vector<std::byte>& out);
// Decompresses `stored` into exactly out.size() bytes; kDataLoss when the
// stored bytes do not decode to that size.
Status decompress(Codec codec, std::span<const std::byte> stored, std::span<std::byte> out);

}  // namespace phos::image::detail
