// SPDX-License-Identifier: Apache-2.0
// Images are untrusted input (docs/security.md): openBeneath, the image
// directory's ownership rule, and what ImageReader refuses or never prints.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "phos/image/reader.h"
#include "phos/image/safe_open.h"
#include "phos/image/writer.h"
#include "status_matchers.h"

namespace phos::image {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr uid_t kSomeUser = 54321;  // a uid nobody on the test host is

void writeText(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string readAll(int fd) {
  std::string text(4096, '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

// Every case runs twice: with openat2, and with the per-component openat
// fallback used on kernels without it.
class SafeOpenTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    detail::setUseOpenat2(GetParam());
    root_ = fs::temp_directory_path() /
            fmt::format("phos-safe-open-{}-{}", ::getpid(),
                        std::regex_replace(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                           std::regex("/"), "-"));
    fs::remove_all(root_);
    fs::create_directories(root_ / "img" / "blobs");
    writeText(root_ / "img" / "blobs" / "000000", "blob bytes");
    writeText(root_ / "secret", "the secret");
    ::chmod((root_ / "secret").c_str(), 0600);
    auto dir = openImageDirectory(root_ / "img");
    ASSERT_THAT(dir.status(), IsOk());
    dir_ = std::move(dir).value();
  }
  void TearDown() override {
    detail::setUseOpenat2(true);
    fs::remove_all(root_);
  }

  Result<Fd> open(std::string_view relative, Requester requester = {}) {
    return openBeneath(dir_.get(), relative, requester);
  }

  fs::path root_;
  Fd dir_;
};

TEST_P(SafeOpenTest, ARegularFileBeneathTheDirectoryOpens) {
  auto fd = open("blobs/000000");
  ASSERT_THAT(fd.status(), IsOk());
  EXPECT_EQ(readAll(fd->get()), "blob bytes");
  EXPECT_THAT(fileSize(fd->get(), "x"), IsOk());
  EXPECT_EQ(*fileSize(fd->get(), "x"), 10u);
  EXPECT_THAT(open("blobs//000000").status(), IsOk());  // an empty component is no component
  EXPECT_THAT(open("blobs/none").status(), StatusIs(Code::kNotFound, HasSubstr("blobs/none is missing")));
}

TEST_P(SafeOpenTest, ALinkAsTheFileIsRefusedAndNamed) {
  fs::create_symlink(root_ / "secret", root_ / "img" / "blobs" / "000001");
  EXPECT_THAT(open("blobs/000001").status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("blobs/000001 is a symbolic link")));
  // A relative link that stays inside the image is no better: links are never followed.
  fs::create_symlink("000000", root_ / "img" / "blobs" / "000002");
  EXPECT_THAT(open("blobs/000002").status(), StatusIs(Code::kPermissionDenied, HasSubstr("symbolic link")));
}

TEST_P(SafeOpenTest, ALinkAsADirectoryOnTheWayIsRefusedAndNamed) {
  fs::create_directories(root_ / "elsewhere");
  writeText(root_ / "elsewhere" / "000000", "not the image's");
  fs::create_directory_symlink(root_ / "elsewhere", root_ / "img" / "late");
  EXPECT_THAT(open("late/000000").status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("late (in late/000000) is a symbolic link")));
}

TEST_P(SafeOpenTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_ / "img" / "blobs" / "fifo").c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(open("blobs/fifo").status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("blobs/fifo is a FIFO, not a regular file")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST_P(SafeOpenTest, ADirectoryIsNotAFile) {
  EXPECT_THAT(open("blobs").status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("blobs is a directory, not a regular file")));
}

TEST_P(SafeOpenTest, DotDotAndAbsolutePathsAreRefusedBeforeAnythingIsOpened) {
  EXPECT_THAT(open("../secret").status(), StatusIs(Code::kPermissionDenied, HasSubstr("leaves the image")));
  EXPECT_THAT(open("blobs/../../secret").status(), StatusIs(Code::kPermissionDenied, HasSubstr("leaves the image")));
  EXPECT_THAT(open((root_ / "secret").string()).status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("is an absolute path")));
  EXPECT_THAT(open("./blobs/000000").status(), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(open("").status(), StatusIs(Code::kPermissionDenied));
}

// Hard links: a link shares the inode, so the readability check on the
// opened file decides. For root nothing is hidden; for another uid, a hard
// link to a file it could not read (what fs.protected_hardlinks=0 would let
// it make) is refused, and one to a file it may read is fine.
TEST_P(SafeOpenTest, AHardLinkIsReadOnlyIfItsRequesterCouldReadTheFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act for another uid";
  ASSERT_EQ(::link((root_ / "secret").c_str(), (root_ / "img" / "blobs" / "hard").c_str()), 0);
  EXPECT_THAT(open("blobs/hard").status(), IsOk());
  EXPECT_THAT(open("blobs/hard", Requester{kSomeUser}).status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("uid 54321 may not read it")));
  ::chmod((root_ / "secret").c_str(), 0644);
  EXPECT_THAT(open("blobs/hard", Requester{kSomeUser}).status(), IsOk());
}

TEST_P(SafeOpenTest, NothingIsWrittenForAnUnprivilegedRequester) {
  EXPECT_THAT(openBeneath(dir_.get(), "late-wanted", Requester{kSomeUser}, O_WRONLY | O_APPEND | O_CREAT).status(),
              StatusIs(Code::kPermissionDenied));
  EXPECT_FALSE(fs::exists(root_ / "img" / "late-wanted"));
  EXPECT_THAT(openBeneath(dir_.get(), "late-wanted", Requester{}, O_WRONLY | O_APPEND | O_CREAT).status(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(Openat2AndFallback, SafeOpenTest, ::testing::Bool(),
                         [](const auto& param) { return param.param ? "openat2" : "openat"; });

TEST(ImageDirectory, ALinkToTheDirectoryIsRefused) {
  fs::path root = fs::temp_directory_path() / fmt::format("phos-safe-dir-{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "img");
  fs::create_directory_symlink(root / "img", root / "link");
  EXPECT_THAT(openImageDirectory(root / "img").status(), IsOk());
  EXPECT_THAT(openImageDirectory(root / "img/").status(), IsOk());
  EXPECT_THAT(openImageDirectory(root / "link").status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("is a symbolic link")));
  // A trailing slash would make the kernel follow the link: it is dropped.
  EXPECT_THAT(openImageDirectory(root / "link/").status(), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(openImageDirectory(root / "none").status(), StatusIs(Code::kNotFound));
  fs::remove_all(root);
}

TEST(ImageDirectory, AUserUsesOnlyDirectoriesItOwnsThatOthersCannotWrite) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to own a directory for another uid";
  fs::path root = fs::temp_directory_path() / fmt::format("phos-safe-owner-{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "img");
  ::chmod((root / "img").c_str(), 0755);
  auto dir = openImageDirectory(root / "img");
  ASSERT_THAT(dir.status(), IsOk());
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{}), IsOk());
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{0}), IsOk());
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{kSomeUser}),
              StatusIs(Code::kPermissionDenied, HasSubstr("uid 54321 may not use the image img: it belongs to uid 0")));
  ASSERT_EQ(::chown((root / "img").c_str(), kSomeUser, static_cast<gid_t>(-1)), 0);
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{kSomeUser}), IsOk());
  ::chmod((root / "img").c_str(), 0775);
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{kSomeUser}),
              StatusIs(Code::kPermissionDenied, HasSubstr("writable by its group")));
  ::chmod((root / "img").c_str(), 0757);
  EXPECT_THAT(checkImageOwner(dir->get(), "img", Requester{kSomeUser}),
              StatusIs(Code::kPermissionDenied, HasSubstr("writable by anyone")));
  fs::remove_all(root);
}

// ImageReader end to end: what a hostile image gets.
class HostileImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            fmt::format("phos-hostile-{}-{}", ::getpid(),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    writeText(root_ / "secret", std::string(8192, 's'));
    ::chmod((root_ / "secret").c_str(), 0600);
    dir_ = root_ / "img";
    auto writer = ImageWriter::create(dir_, {.chunkBytes = 4096});
    ASSERT_THAT(writer.status(), IsOk());
    std::vector<std::byte> data(8192, std::byte{7});
    auto blob = (*writer)->addBlob("gpu/0/0x1000", "gpu-memory", data.size());
    ASSERT_THAT(blob.status(), IsOk());
    ASSERT_THAT((*writer)->writeBlob(*blob, data), IsOk());
    writeText((*writer)->cpuDirectory() / "pages-1.img", "pages");
    ASSERT_THAT((*writer)->commit(), IsOk());
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_, dir_;
};

TEST_F(HostileImageTest, ABlobThatIsALinkIsRefusedAtOpenBeforeAnyByteIsRead) {
  fs::remove(dir_ / "blobs" / "000000");
  fs::create_symlink(root_ / "secret", dir_ / "blobs" / "000000");
  EXPECT_THAT(ImageReader::open(dir_).status(),
              StatusIs(Code::kPermissionDenied,
                       HasSubstr("blob 'gpu/0/0x1000': blobs/000000 is a symbolic link")));
}

TEST_F(HostileImageTest, AManifestThatIsALinkIsRefused) {
  fs::rename(dir_ / "manifest.json", root_ / "manifest.json");
  fs::create_symlink(root_ / "manifest.json", dir_ / "manifest.json");
  EXPECT_THAT(ImageReader::open(dir_).status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("manifest.json is a symbolic link")));
}

TEST_F(HostileImageTest, ACpuFileThatIsALinkIsAProblemOfVerify) {
  auto reader = ImageReader::open(dir_);
  ASSERT_THAT(reader.status(), IsOk());
  fs::remove(dir_ / "cpu" / "pages-1.img");
  fs::create_symlink(root_ / "secret", dir_ / "cpu" / "pages-1.img");
  auto problems = (*reader)->verifyCpuFiles();
  ASSERT_THAT(problems, SizeIs(1));
  EXPECT_THAT(problems[0].what, HasSubstr("cpu/pages-1.img is a symbolic link"));
  // Neither the secret's size (8192) nor anything else read from it.
  EXPECT_THAT(problems[0].what, Not(HasSubstr("8192")));
}

TEST_F(HostileImageTest, AMismatchNamesTheChunkButPrintsNoChecksum) {
  {
    std::fstream f(dir_ / "blobs" / "000000", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('x');
  }
  writeText(dir_ / "cpu" / "pages-1.img", "PAGES");
  auto reader = ImageReader::open(dir_);
  ASSERT_THAT(reader.status(), IsOk());
  const std::regex hex("[0-9a-f]{16}");
  auto problems = (*reader)->verify();
  ASSERT_THAT(problems, SizeIs(2));
  EXPECT_EQ(problems[0].where, "blob 'gpu/0/0x1000' chunk 1");
  EXPECT_THAT(problems[0].what, HasSubstr("does not match its checksum in the manifest"));
  EXPECT_EQ(problems[1].where, "cpu/pages-1.img");
  EXPECT_THAT(problems[1].what, HasSubstr("does not match its checksum in the manifest"));
  for (const Problem& p : problems) EXPECT_FALSE(std::regex_search(p.what, hex)) << p.what;
}

TEST_F(HostileImageTest, LateChunksAreForRootOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to own a directory for another uid";
  writeText(dir_ / "late.json", R"({"chunks": [[0, 1, 1]]})");
  ASSERT_EQ(::chown(dir_.c_str(), kSomeUser, static_cast<gid_t>(-1)), 0);
  // Readable by the user: the image's files are 0644.
  EXPECT_THAT(ImageReader::open(dir_, Requester{kSomeUser}).status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("late.json (late chunks of a migration) is restored only by root")));
  EXPECT_THAT(ImageReader::open(dir_, Requester{0}).status(), IsOk());
}

TEST_F(HostileImageTest, AnImageOfAnotherUserIsRefusedBeforeItsManifestIsRead) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act for another uid";
  // The manifest is garbage: refused for the owner rule, not for the JSON.
  writeText(dir_ / "manifest.json", "not json");
  EXPECT_THAT(ImageReader::open(dir_, Requester{kSomeUser}).status(),
              StatusIs(Code::kPermissionDenied, HasSubstr("it belongs to uid 0")));
}

TEST_F(HostileImageTest, AWriterOwnerGetsTheWholeTree) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files away";
  fs::path dir = root_ / "owned";
  auto writer = ImageWriter::create(dir, {.chunkBytes = 4096, .owner = kSomeUser});
  ASSERT_THAT(writer.status(), IsOk());
  std::vector<std::byte> data(100, std::byte{1});
  auto blob = (*writer)->addBlob("b", "gpu-memory", data.size());
  ASSERT_THAT((*writer)->writeBlob(*blob, data), IsOk());
  writeText((*writer)->cpuDirectory() / "pages-1.img", "pages");
  ASSERT_THAT((*writer)->commit(), IsOk());
  for (const fs::path& p : {dir, dir / "manifest.json", dir / "blobs", dir / "blobs" / "000000", dir / "cpu",
                            dir / "cpu" / "pages-1.img"}) {
    struct stat st {};
    ASSERT_EQ(::lstat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_uid, kSomeUser) << p;
  }
  auto reader = ImageReader::open(dir, Requester{kSomeUser});
  ASSERT_THAT(reader.status(), IsOk());
  EXPECT_THAT((*reader)->verify(), SizeIs(0));
}

}  // namespace
}  // namespace phos::image
