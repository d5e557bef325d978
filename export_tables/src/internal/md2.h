// SPDX-License-Identifier: Apache-2.0
// MD2 (RFC 1319), the integrity check's hash, for its tests.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace phos::export_tables::detail {

std::array<std::uint8_t, 16> md2(std::span<const std::uint8_t> message);

}  // namespace phos::export_tables::detail
