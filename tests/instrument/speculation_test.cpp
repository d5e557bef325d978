// SPDX-License-Identifier: Apache-2.0
// Speculated read/write sets of a launch from its signature and parameter bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "phos/instrument/speculation.h"

namespace phos::instrument {
namespace {

const Buffer kX{0x7000'0000'0000, 4096};
const Buffer kY{0x7000'0001'0000, 4096};
const Buffer kZ{0x7000'0002'0000, 256};
const Buffer kGlobal{0x7100'0000'0000, 64};

std::optional<Buffer> lookup(uint64_t address) {
  for (const Buffer& b : {kX, kY, kZ}) {
    if (address >= b.base && address < b.base + b.size) return b;
  }
  return std::nullopt;
}

std::optional<Buffer> globalLookup(std::string_view name) {
  if (name == "g") return kGlobal;
  return std::nullopt;
}

std::vector<std::byte> pack(std::initializer_list<uint64_t> words) {
  std::vector<std::byte> out(words.size() * 8);
  size_t i = 0;
  for (uint64_t w : words) std::memcpy(out.data() + 8 * i++, &w, 8);
  return out;
}

KernelSignature signature(std::vector<PointerWord> words) {
  KernelSignature s;
  s.name = "k";
  s.sources = kFromPtx;
  uint32_t ordinal = 0;
  for (PointerWord& w : words) {
    ParamSignature p;
    p.ordinal = ordinal++;
    p.offset = w.offset;
    p.size = 8;
    w.observed = w.observed == Access::kNone ? w.access : w.observed;
    p.words.push_back(w);
    s.params.push_back(p);
  }
  s.paramBytes = static_cast<uint32_t>(8 * words.size());
  return s;
}

PointerWord at(uint32_t offset, Access a) {
  PointerWord w;
  w.offset = offset;
  w.access = a;
  return w;
}

TEST(Speculation, WordsGoInByTheirAccess) {
  KernelSignature s = signature({at(0, Access::kRead), at(8, Access::kReadWrite), at(16, Access::kNone)});
  // An interior pointer names its whole allocation; a word pointing nowhere adds nothing.
  auto params = pack({kX.base + 100, kY.base, kZ.base});
  LaunchAccessSet set = speculateLaunch(s, params, lookup);
  EXPECT_EQ(set.reads, (std::vector<Buffer>{kX, kY}));
  EXPECT_EQ(set.writes, (std::vector<Buffer>{kY}));
  EXPECT_FALSE(set.incomplete);
}

TEST(Speculation, SameBufferTwiceIsListedOnce) {
  KernelSignature s = signature({at(0, Access::kWrite), at(8, Access::kWrite)});
  auto params = pack({kZ.base, kZ.base + 8});
  LaunchAccessSet set = speculateLaunch(s, params, lookup);
  EXPECT_TRUE(set.reads.empty());
  EXPECT_EQ(set.writes, (std::vector<Buffer>{kZ}));
}

TEST(Speculation, UnmatchedWordsAndShortBuffersAddNothing) {
  KernelSignature s = signature({at(0, Access::kRead), at(8, Access::kWrite)});
  auto params = pack({42, kY.base});
  params.resize(12);  // the second word is cut short
  LaunchAccessSet set = speculateLaunch(s, params, lookup);
  EXPECT_TRUE(set.reads.empty());
  EXPECT_TRUE(set.writes.empty());
}

TEST(Speculation, EscapedWordsAreReadWriteUnlessDeclaredConst) {
  PointerWord escaped = at(0, Access::kRead);  // even if `access` says otherwise
  escaped.escapes = true;
  PointerWord constEscaped = at(8, Access::kRead);
  constEscaped.escapes = true;
  constEscaped.declaredConst = true;
  PointerWord constButWritten = at(16, Access::kReadWrite);
  constButWritten.observed = Access::kWrite;
  constButWritten.escapes = true;
  constButWritten.declaredConst = true;
  KernelSignature s = signature({escaped, constEscaped, constButWritten});
  auto params = pack({kX.base, kY.base, kZ.base});
  LaunchAccessSet set = speculateLaunch(s, params, lookup);
  EXPECT_EQ(set.reads, (std::vector<Buffer>{kX, kY, kZ}));
  EXPECT_EQ(set.writes, (std::vector<Buffer>{kX, kZ}));
}

TEST(Speculation, GlobalsAndIndirectAccesses) {
  KernelSignature s = signature({at(0, Access::kRead)});
  s.globals = {{"g", Access::kReadWrite}, {"unknown_to_the_session", Access::kRead}};
  s.indirect = Access::kWrite;
  auto params = pack({kX.base});
  LaunchAccessSet set = speculateLaunch(s, params, lookup, globalLookup);
  EXPECT_EQ(set.reads, (std::vector<Buffer>{kX, kGlobal}));
  EXPECT_EQ(set.writes, (std::vector<Buffer>{kGlobal}));
  EXPECT_TRUE(set.incomplete);

  // Without a global lookup the globals are left out, nothing else changes.
  LaunchAccessSet noGlobals = speculateLaunch(s, params, lookup);
  EXPECT_EQ(noGlobals.reads, (std::vector<Buffer>{kX}));
  EXPECT_TRUE(noGlobals.writes.empty());
}

TEST(Speculation, OpaqueLaunchMatchesEveryAlignedWord) {
  auto params = pack({kZ.base, 7, kX.base + 8, kZ.base + 1});
  params.resize(params.size() + 4);  // a trailing 4-byte scalar
  LaunchAccessSet set = speculateOpaqueLaunch(params, lookup);
  EXPECT_EQ(set.reads, (std::vector<Buffer>{kX, kZ}));
  EXPECT_EQ(set.writes, (std::vector<Buffer>{kX, kZ}));
  EXPECT_TRUE(set.incomplete);

  LaunchAccessSet empty = speculateOpaqueLaunch({}, lookup);
  EXPECT_TRUE(empty.reads.empty());
  EXPECT_TRUE(empty.incomplete);
}

}  // namespace
}  // namespace phos::instrument
