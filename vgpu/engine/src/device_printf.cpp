// SPDX-License-Identifier: Apache-2.0
// Device printf: walks the format, pulls each argument from the argument buffer with
// the size its conversion implies, and formats it with the host's snprintf.
#include "device_printf.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace phos::vgpu::engine::detail {
namespace {

constexpr size_t kMaxFormat = 4096;
constexpr size_t kMaxString = 1 << 16;

Result<std::string> readCString(uint64_t address, size_t limit, const DeviceReader& read) {
  std::string s;
  for (size_t i = 0; i < limit; ++i) {
    char c;
    if (!read(address + i, &c, 1)) {
      return makeError(Code::kOutOfRange, "printf reads unmapped address {:#x}", address + i);
    }
    if (c == '\0') return s;
    s.push_back(c);
  }
  return s;
}

template <typename T>
std::string formatOne(const std::string& spec, T value) {
  char buffer[512];
  int n = std::snprintf(buffer, sizeof buffer, spec.c_str(), value);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof buffer) return std::string(buffer, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), spec.c_str(), value);
  big.resize(static_cast<size_t>(n));
  return big;
}

}  // namespace

Result<FormattedPrintf> formatDevicePrintf(uint64_t format, uint64_t args,
                                           const DeviceReader& read) {
  ASSIGN_OR_RETURN(std::string fmtText, readCString(format, kMaxFormat, read));
  FormattedPrintf out;
  uint64_t offset = 0;
  auto fetch = [&](size_t size, void* dst) -> Status {
    offset = (offset + size - 1) / size * size;
    if (!read(args + offset, dst, size)) {
      return makeError(Code::kOutOfRange, "printf argument at unmapped address {:#x}",
                       args + offset);
    }
    offset += size;
    ++out.arguments;
    return Status::ok();
  };
  const std::string_view f = fmtText;
  size_t i = 0;
  while (i < f.size()) {
    char c = f[i];
    if (c != '%') {
      out.text.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '%') {
      out.text.push_back('%');
      i += 2;
      continue;
    }
    size_t start = i++;
    while (i < f.size() && std::strchr("-+ #0", f[i])) ++i;
    while (i < f.size() && (std::isdigit(static_cast<unsigned char>(f[i])))) ++i;
    if (i < f.size() && f[i] == '.') {
      ++i;
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) ++i;
    }
    size_t lengthStart = i;
    while (i < f.size() && std::strchr("hlLqjzt", f[i])) ++i;
    if (i >= f.size()) {
      out.text.append(f.substr(start));
      break;
    }
    std::string_view length = f.substr(lengthStart, i - lengthStart);
    char conv = f[i++];
    // The spec without CUDA's length modifiers; the value is passed at full width.
    std::string spec(f.substr(start, lengthStart - start));
    bool wide = length.find('l') != std::string_view::npos || length == "j" ||
                length == "z" || length == "t" || length == "q" || length == "L";
    switch (conv) {
      case 'd': case 'i': {
        int64_t v = 0;
        if (wide) {
          RETURN_IF_ERROR(fetch(8, &v));
        } else {
          int32_t v32 = 0;
          RETURN_IF_ERROR(fetch(4, &v32));
          v = v32;
          if (length == "h") v = static_cast<int16_t>(v32);
          if (length == "hh") v = static_cast<signed char>(v32);
        }
        out.text += formatOne(spec + "ll" + conv, static_cast<long long>(v));
        break;
      }
      case 'u': case 'x': case 'X': case 'o': {
        uint64_t v = 0;
        if (wide) {
          RETURN_IF_ERROR(fetch(8, &v));
        } else {
          uint32_t v32 = 0;
          RETURN_IF_ERROR(fetch(4, &v32));
          v = v32;
          if (length == "h") v = static_cast<uint16_t>(v32);
          if (length == "hh") v = static_cast<unsigned char>(v32);
        }
        out.text += formatOne(spec + "ll" + conv, static_cast<unsigned long long>(v));
        break;
      }
      case 'c': {
        int32_t v = 0;
        RETURN_IF_ERROR(fetch(4, &v));
        out.text += formatOne(spec + conv, v);
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A': {
        double v = 0;
        RETURN_IF_ERROR(fetch(8, &v));
        out.text += formatOne(spec + conv, v);
        break;
      }
      case 'p': {
        uint64_t v = 0;
        RETURN_IF_ERROR(fetch(8, &v));
        out.text += formatOne(spec + "p", reinterpret_cast<void*>(v));
        break;
      }
      case 's': {
        uint64_t v = 0;
        RETURN_IF_ERROR(fetch(8, &v));
        if (v == 0) {
          out.text += formatOne(spec + "s", "(null)");
        } else {
          ASSIGN_OR_RETURN(std::string s, readCString(v, kMaxString, read));
          out.text += formatOne(spec + "s", s.c_str());
        }
        break;
      }
      default:
        // Unknown conversion: printed as written, like CUDA.
        out.text.append(f.substr(start, i - start));
    }
  }
  return out;
}

}  // namespace phos::vgpu::engine::detail
