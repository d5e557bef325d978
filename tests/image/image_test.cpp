// SPDX-License-Identifier: Apache-2.0
// Tests of the checkpoint image format: round trips, atomic publication, damage detection.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "status_matchers.h"

namespace phos::image {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr uint32_t kChunk = 4096;

std::vector<std::byte> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::vector<std::byte> compressibleBytes(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i / 64) % 7);
  return v;
}

void flipByte(const fs::path& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

void writeText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            fmt::format("phos-image-test-{}-{}", ::getpid(),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // One image with one blob of `data`, committed.
  fs::path writeImage(const std::vector<std::byte>& data, Codec codec = Codec::kNone) {
    fs::path dir = root_ / "img";
    auto writer = ImageWriter::create(dir, {.codec = codec, .chunkBytes = kChunk});
    EXPECT_THAT(writer.status(), IsOk());
    auto blob = (*writer)->addBlob("gpu/0/0x1000", "gpu-memory", data.size(), {{"device", 0}});
    EXPECT_THAT(blob.status(), IsOk());
    EXPECT_THAT((*writer)->writeBlob(*blob, data), IsOk());
    EXPECT_THAT((*writer)->commit(), IsOk());
    return dir;
  }

  // Entries of root_ other than the published images: staging leftovers.
  std::vector<std::string> leftovers() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) {
      if (e.path().filename().string().starts_with(".")) names.push_back(e.path().string());
    }
    return names;
  }

  fs::path root_;
};

class CodecRoundTrip : public ImageTest, public ::testing::WithParamInterface<Codec> {};

TEST_P(CodecRoundTrip, EveryBlobShapeReadsBackWholeAndInRanges) {
  const std::vector<uint64_t> sizes{0, 1, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + kChunk / 2};
  fs::path dir = root_ / "img";
  std::vector<std::vector<std::byte>> contents;
  {
    auto writer = ImageWriter::create(dir, {.codec = GetParam(), .chunkBytes = kChunk});
    ASSERT_THAT(writer.status(), IsOk());
    for (size_t i = 0; i < sizes.size(); ++i) {
      // Alternate compressible and random contents.
      contents.push_back(i % 2 ? randomBytes(sizes[i], static_cast<uint32_t>(i))
                               : compressibleBytes(sizes[i]));
      auto blob = (*writer)->addBlob(fmt::format("blob{}", i), "gpu-memory", sizes[i]);
      ASSERT_THAT(blob.status(), IsOk());
      ASSERT_THAT((*writer)->writeBlob(*blob, contents.back()), IsOk());
    }
    (*writer)->setState({{"process", {{"pid", 42}}}});
    ASSERT_THAT((*writer)->commit(), IsOk());
  }
  auto reader = ImageReader::open(dir);
  ASSERT_THAT(reader.status(), IsOk());
  const Manifest& m = (*reader)->manifest();
  EXPECT_EQ(m.state["process"]["pid"], 42);
  ASSERT_THAT(m.blobs, SizeIs(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto index = (*reader)->findBlob(fmt::format("blob{}", i));
    ASSERT_TRUE(index.has_value());
    std::vector<std::byte> back(sizes[i]);
    ASSERT_THAT((*reader)->read(*index, 0, back), IsOk());
    EXPECT_EQ(back, contents[i]) << "blob " << i;
    if (sizes[i] > 10) {  // a range across a chunk boundary when there is one
      uint64_t offset = std::min<uint64_t>(kChunk - 5, sizes[i] - 10);
      std::vector<std::byte> part(10);
      ASSERT_THAT((*reader)->read(*index, offset, part), IsOk());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), contents[i].begin() + offset));
    }
  }
  EXPECT_THAT((*reader)->verify(), IsEmpty());
  EXPECT_THAT(leftovers(), IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecRoundTrip,
                         ::testing::Values(Codec::kNone, Codec::kZstd, Codec::kLz4),
                         [](const auto& param) { return std::string(codecName(param.param)); });

TEST_F(ImageTest, CompressionShrinksCompressibleChunksAndStoresRandomOnesRaw) {
  for (Codec codec : {Codec::kZstd, Codec::kLz4}) {
    fs::remove_all(root_ / "img");
    std::vector<std::byte> data = compressibleBytes(2 * kChunk);
    std::vector<std::byte> noise = randomBytes(kChunk, 7);
    data.insert(data.end(), noise.begin(), noise.end());
    fs::path dir = writeImage(data, codec);
    auto reader = ImageReader::open(dir);
    ASSERT_THAT(reader.status(), IsOk());
    const BlobInfo& blob = (*reader)->manifest().blobs.at(0);
    EXPECT_EQ(blob.chunks[0].codec, codec);
    EXPECT_LT(blob.chunks[0].storedBytes, kChunk / 4);
    EXPECT_EQ(blob.chunks[2].codec, Codec::kNone) << "random data does not compress";
    EXPECT_EQ(blob.chunks[2].storedBytes, kChunk);
  }
}

TEST_F(ImageTest, ChunksMayArriveOutOfOrderFromManyThreads) {
  constexpr uint64_t kChunks = 64;
  std::vector<std::byte> data = randomBytes(kChunks * kChunk, 3);
  fs::path dir = root_ / "img";
  auto writer = ImageWriter::create(dir, {.codec = Codec::kLz4, .chunkBytes = kChunk});
  ASSERT_THAT(writer.status(), IsOk());
  auto blob = (*writer)->addBlob("big", "gpu-memory", data.size());
  ASSERT_THAT(blob.status(), IsOk());
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = kChunks; i-- > 0;) {  // backwards, interleaved
        if (i % 4 != t) continue;
        EXPECT_THAT((*writer)->writeChunk(*blob, i,
                                          std::span(data).subspan(i * kChunk, kChunk)),
                    IsOk());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_THAT((*writer)->commit(), IsOk());
  auto reader = ImageReader::open(dir);
  ASSERT_THAT(reader.status(), IsOk());
  std::vector<std::byte> back(data.size());
  ASSERT_THAT((*reader)->read(0, 0, back), IsOk());
  EXPECT_EQ(back, data);
}

// Post-copy (live migration): chunk 1 of the blob is late. A reader asks for
// it in late/wanted, waits until late/0.1 appears, and checks it against the
// checksum late.json gives; late/failed ends the wait with its reason.
TEST_F(ImageTest, LateChunksAreAskedForWaitedForAndChecked) {
  std::vector<std::byte> data = randomBytes(3 * kChunk, 11);
  fs::path dir = writeImage(data);
  const uint64_t sum = checksum(std::span(data).subspan(kChunk, kChunk));
  fs::create_directories(dir / kLateDir);
  writeText(dir / kLateFile, fmt::format(R"({{"chunks": [[0, 1, {}]]}})", sum));
  auto reader = ImageReader::open(dir);
  ASSERT_THAT(reader.status(), IsOk());
  EXPECT_EQ((*reader)->lateChunks(), 1u);

  // Not late: read at once.
  std::vector<std::byte> first(kChunk);
  ASSERT_THAT((*reader)->readChunk(0, 0, first), IsOk());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), data.begin()));

  // Late: the request shows up, then the bytes do.
  std::thread arrives([&] {
    for (int i = 0; i < 2000 && !fs::exists(dir / kLateDir / "wanted"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream wanted(dir / kLateDir / "wanted");
    std::string line;
    std::getline(wanted, line);
    EXPECT_EQ(line, "0 1");
    std::ofstream out(dir / kLateDir / "0.1.part", std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data() + kChunk), kChunk);
    out.close();
    fs::rename(dir / kLateDir / "0.1.part", dir / kLateDir / "0.1");
  });
  std::vector<std::byte> late(kChunk);
  ASSERT_THAT((*reader)->readChunk(0, 1, late), IsOk());
  arrives.join();
  EXPECT_TRUE(std::equal(late.begin(), late.end(), data.begin() + kChunk));

  // Bytes that do not match late.json's checksum are refused.
  writeText(dir / kLateFile, R"({"chunks": [[0, 2, 12345]]})");
  auto other = ImageReader::open(dir);
  ASSERT_THAT(other.status(), IsOk());
  {
    std::ofstream out(dir / kLateDir / "0.2", std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data() + 2 * kChunk), kChunk);
  }
  EXPECT_THAT((*other)->readChunk(0, 2, late), StatusIs(Code::kDataLoss));

  // The source went away: the wait ends with why.
  fs::remove(dir / kLateDir / "0.2");
  writeText(dir / kLateDir / "failed", "the source closed the connection");
  auto status = (*other)->readChunk(0, 2, late);
  EXPECT_THAT(status, StatusIs(Code::kUnavailable));
  EXPECT_THAT(status.message(), ::testing::HasSubstr("the source closed the connection"));

  // A damaged list is refused at open.
  writeText(dir / kLateFile, R"({"chunks": [[7, 0, 1]]})");
  EXPECT_THAT(ImageReader::open(dir).status(), StatusIs(Code::kDataLoss));
}

TEST_F(ImageTest, NothingAppearsUntilCommitAndAnAbandonedWriterLeavesNothing) {
  fs::path dir = root_ / "img";
  {
    auto writer = ImageWriter::create(dir, {.chunkBytes = kChunk});
    ASSERT_THAT(writer.status(), IsOk());
    auto blob = (*writer)->addBlob("b", "gpu-memory", kChunk);
    ASSERT_THAT(blob.status(), IsOk());
    ASSERT_THAT((*writer)->writeBlob(*blob, compressibleBytes(kChunk)), IsOk());
    EXPECT_FALSE(fs::exists(dir));
    EXPECT_THAT(leftovers(), SizeIs(1));  // the staging directory
  }  // dropped without commit, as when a checkpoint fails
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_THAT(leftovers(), IsEmpty());
}

TEST_F(ImageTest, CommitRefusesAnIncompleteBlob) {
  fs::path dir = root_ / "img";
  auto writer = ImageWriter::create(dir, {.chunkBytes = kChunk});
  ASSERT_THAT(writer.status(), IsOk());
  auto blob = (*writer)->addBlob("half", "gpu-memory", 2 * kChunk);
  ASSERT_THAT(blob.status(), IsOk());
  ASSERT_THAT((*writer)->writeChunk(*blob, 1, compressibleBytes(kChunk)), IsOk());
  EXPECT_THAT((*writer)->commit(),
              StatusIs(Code::kFailedPrecondition, HasSubstr("'half': 1 of 2 chunks")));
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_THAT(leftovers(), IsEmpty());
  EXPECT_THAT((*writer)->commit(), StatusIs(Code::kFailedPrecondition));
}

TEST_F(ImageTest, WriterRejectsBadRequests) {
  fs::create_directories(root_ / "exists");
  EXPECT_THAT(ImageWriter::create(root_ / "exists").status(),
              StatusIs(Code::kAlreadyExists, HasSubstr("already exists")));
  EXPECT_THAT(ImageWriter::create(root_ / "x", {.chunkBytes = 0}).status(),
              StatusIs(Code::kInvalidArgument));

  auto writer = ImageWriter::create(root_ / "img", {.chunkBytes = kChunk});
  ASSERT_THAT(writer.status(), IsOk());
  auto blob = (*writer)->addBlob("b", "gpu-memory", kChunk + 10);
  ASSERT_THAT(blob.status(), IsOk());
  EXPECT_THAT((*writer)->addBlob("b", "gpu-memory", 1).status(),
              StatusIs(Code::kAlreadyExists, HasSubstr("'b'")));
  EXPECT_THAT((*writer)->addBlob("c", "gpu-memory", 1, nlohmann::json::array()).status(),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT((*writer)->writeChunk(*blob, 1, compressibleBytes(kChunk)),
              StatusIs(Code::kInvalidArgument, HasSubstr("is 10 bytes, not 4096")));
  EXPECT_THAT((*writer)->writeChunk(*blob, 2, compressibleBytes(10)),
              StatusIs(Code::kOutOfRange));
  EXPECT_THAT((*writer)->writeChunk(7, 0, compressibleBytes(10)), StatusIs(Code::kOutOfRange));
  ASSERT_THAT((*writer)->writeChunk(*blob, 1, compressibleBytes(10)), IsOk());
  EXPECT_THAT((*writer)->writeChunk(*blob, 1, compressibleBytes(10)),
              StatusIs(Code::kAlreadyExists));
  EXPECT_THAT((*writer)->writeBlob(*blob, compressibleBytes(3)),
              StatusIs(Code::kInvalidArgument));
}

TEST_F(ImageTest, DamagedChunkIsNamedByReadAndVerify) {
  for (Codec codec : {Codec::kNone, Codec::kZstd, Codec::kLz4}) {
    fs::remove_all(root_ / "img");
    fs::path dir = writeImage(compressibleBytes(3 * kChunk), codec);
    auto before = ImageReader::open(dir);
    ASSERT_THAT(before.status(), IsOk());
    const ChunkInfo& c1 = (*before)->manifest().blobs[0].chunks[1];
    flipByte(dir / (*before)->manifest().blobs[0].file, c1.fileOffset + c1.storedBytes / 2);

    auto reader = ImageReader::open(dir);
    ASSERT_THAT(reader.status(), IsOk());
    std::vector<std::byte> out(kChunk);
    EXPECT_THAT((*reader)->readChunk(0, 0, out), IsOk());
    EXPECT_THAT((*reader)->readChunk(0, 1, out),
                StatusIs(Code::kDataLoss, HasSubstr("blob 'gpu/0/0x1000' chunk 1")))
        << codecName(codec);
    auto problems = (*reader)->verify();
    ASSERT_THAT(problems, SizeIs(1)) << codecName(codec);
    EXPECT_EQ(problems[0].where, "blob 'gpu/0/0x1000' chunk 1");
  }
}

TEST_F(ImageTest, TruncatedOrMissingBlobFileIsRefusedAtOpen) {
  fs::path dir = writeImage(randomBytes(2 * kChunk, 1));
  fs::path file = dir / "blobs" / "000000";
  fs::resize_file(file, kChunk + 100);
  EXPECT_THAT(ImageReader::open(dir).status(),
              StatusIs(Code::kDataLoss, HasSubstr("has 4196 bytes, its chunks need 8192")));
  fs::remove(file);
  EXPECT_THAT(ImageReader::open(dir).status(), StatusIs(Code::kDataLoss, HasSubstr("missing")));
}

TEST_F(ImageTest, DamagedManifestIsRefusedWithWhatIsWrong) {
  EXPECT_THAT(ImageReader::open(root_ / "nothing").status(),
              StatusIs(Code::kNotFound, HasSubstr("no such image directory")));
  fs::create_directories(root_ / "empty");
  EXPECT_THAT(ImageReader::open(root_ / "empty").status(),
              StatusIs(Code::kNotFound, HasSubstr("manifest.json is missing")));

  fs::path dir = writeImage(compressibleBytes(2 * kChunk));
  fs::path manifestPath = dir / "manifest.json";
  nlohmann::json good = nlohmann::json::parse(std::ifstream(manifestPath));
  auto openWith = [&](const nlohmann::json& j) {
    writeText(manifestPath, j.dump());
    return ImageReader::open(dir).status();
  };

  writeText(manifestPath, good.dump().substr(0, 40));
  EXPECT_THAT(ImageReader::open(dir).status(), StatusIs(Code::kDataLoss, HasSubstr("not valid JSON")));

  nlohmann::json j = good;
  j["version"] = kFormatVersion + 1;
  EXPECT_THAT(openWith(j), StatusIs(Code::kNotSupported, HasSubstr("newer")));
  j = good;
  j["format"] = "tarball";
  EXPECT_THAT(openWith(j), StatusIs(Code::kNotFound, HasSubstr("not a PhOS manifest")));
  j = good;
  j.erase("blobs");
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("manifest.blobs: missing")));
  j = good;
  j["blobs"][0]["size"] = "big";
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("blobs[0].size: expected")));
  j = good;
  j["blobs"][0]["chunks"].erase(1);
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("blobs[0].chunks: 1 entries")));
  j = good;
  j["blobs"][0]["chunks"][1][2] = "brotli";
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("blobs[0].chunks[1]")));
  j = good;
  j["blobs"][0]["chunks"][0][3] = "xyz";
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("16 hex digits")));
  j = good;
  j["blobs"][0]["file"] = "../../etc/passwd";
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("not a path inside the image")));
  j = good;
  j["blobs"].push_back(good["blobs"][0]);
  EXPECT_THAT(openWith(j), StatusIs(Code::kDataLoss, HasSubstr("appears twice")));
  EXPECT_THAT(openWith(good), IsOk());
}

TEST_F(ImageTest, CpuFilesAreRecordedAndVerified) {
  fs::path dir = root_ / "img";
  {
    auto writer = ImageWriter::create(dir);
    ASSERT_THAT(writer.status(), IsOk());
    fs::path cpu = (*writer)->cpuDirectory();
    writeText(cpu / "inventory.img", "inventory");
    writeText(cpu / "pages-1.img", std::string(10000, 'p'));
    fs::create_directories(cpu / "sub");
    writeText(cpu / "sub" / "x.img", "x");
    ASSERT_THAT((*writer)->commit(), IsOk());
  }
  auto reader = ImageReader::open(dir);
  ASSERT_THAT(reader.status(), IsOk());
  const auto& files = (*reader)->manifest().cpuFiles;
  ASSERT_THAT(files, SizeIs(3));
  EXPECT_EQ(files[0].path, "inventory.img");
  EXPECT_EQ(files[1].path, "pages-1.img");
  EXPECT_EQ(files[1].size, 10000u);
  EXPECT_EQ(files[2].path, "sub/x.img");
  EXPECT_THAT((*reader)->verify(), IsEmpty());

  flipByte(dir / "cpu" / "pages-1.img", 5000);
  fs::remove(dir / "cpu" / "sub" / "x.img");
  writeText(dir / "cpu" / "inventory.img", "inventory+");
  auto problems = (*reader)->verify();
  ASSERT_THAT(problems, SizeIs(3));
  EXPECT_EQ(problems[0].where, "cpu/inventory.img");
  EXPECT_THAT(problems[0].what, HasSubstr("10 bytes, 9 recorded"));
  EXPECT_EQ(problems[1].where, "cpu/pages-1.img");
  EXPECT_THAT(problems[1].what, HasSubstr("checksum"));
  EXPECT_EQ(problems[2].where, "cpu/sub/x.img");
  EXPECT_EQ(problems[2].what, "missing");
}

TEST_F(ImageTest, ReaderRejectsBadRanges) {
  fs::path dir = writeImage(compressibleBytes(kChunk + 1));
  auto reader = ImageReader::open(dir);
  ASSERT_THAT(reader.status(), IsOk());
  std::vector<std::byte> out(2);
  EXPECT_THAT((*reader)->read(0, kChunk, out), StatusIs(Code::kOutOfRange, HasSubstr("outside")));
  EXPECT_THAT((*reader)->read(1, 0, out), StatusIs(Code::kOutOfRange));
  EXPECT_THAT((*reader)->readChunk(0, 1, out), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT((*reader)->readChunk(0, 2, out), StatusIs(Code::kOutOfRange));
  EXPECT_FALSE((*reader)->findBlob("nope").has_value());
}

TEST(CodecNames, ParseAndPrint) {
  for (Codec c : {Codec::kNone, Codec::kZstd, Codec::kLz4}) {
    auto parsed = parseCodec(codecName(c));
    ASSERT_THAT(parsed.status(), IsOk());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_THAT(parseCodec("gzip").status(),
              StatusIs(Code::kInvalidArgument, HasSubstr("none, zstd or lz4")));
}

}  // namespace
}  // namespace phos::image
