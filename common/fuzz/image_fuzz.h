// SPDX-License-Identifier: Apache-2.0
// The image reader fuzzer's input format (image_reader_fuzzer.cpp), shared
// with the seed maker and regression runner (image_fuzz_main.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace phos::image::fuzz {

// Between two files of an input.
inline constexpr std::string_view kSeparator = "\n--phos-fuzz-file--\n";

// The files of an input, in order.
inline constexpr std::array<std::string_view, 8> kFiles = {
    "manifest.json", "blobs/000000", "blobs/000001", "late.json",
    "late/0.0",      "late/0.1",     "cpu/pages-1.img", "late/failed",
};

// The flags byte: what a hostile user would put in place of a file.
inline constexpr uint8_t kBlobIsLink = 1;      // blobs/000000 -> a file outside the image
inline constexpr uint8_t kBlobIsFifo = 2;      // blobs/000001 is a FIFO
inline constexpr uint8_t kLateDirIsLink = 4;   // late -> a directory outside the image
inline constexpr uint8_t kCpuFileIsLink = 8;   // cpu/pages-1.img -> a file outside the image

// Chunks larger than this are not read (a manifest may claim 1 GiB ones).
inline constexpr uint32_t kMaxChunk = 1u << 20;

// Runs one input: writes its image into a scratch directory and reads it.
void runOne(const uint8_t* data, size_t size);

}  // namespace phos::image::fuzz
