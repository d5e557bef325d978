// SPDX-License-Identifier: Apache-2.0
// Kernel signatures outside the PTX: demangling, declared types, the signature
// database file and its errors, and the JSON of one signature.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/instrument/signature.h"
#include "status_matchers.h"

namespace phos::instrument {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Signature, AccessNames) {
  EXPECT_EQ(name(Access::kNone), "none");
  EXPECT_EQ(name(Access::kRead), "read");
  EXPECT_EQ(name(Access::kWrite), "write");
  EXPECT_EQ(name(Access::kReadWrite), "readwrite");
  EXPECT_EQ(Access::kRead | Access::kWrite, Access::kReadWrite);
}

TEST(Signature, Demangle) {
  EXPECT_EQ(demangle("_Z5saxpyifPKfPf"), "saxpy(int, float, float const*, float*)");
  EXPECT_EQ(demangle("_Z12matmul_tiledIfLi16EEvPKT_S2_PS0_iii"),
            "void matmul_tiled<float, 16>(float const*, float const*, float*, int, int, int)");
  EXPECT_EQ(demangle("saxpy"), std::nullopt);  // extern "C"
  EXPECT_EQ(demangle("_Znot valid"), std::nullopt);
  EXPECT_EQ(demangle(""), std::nullopt);
}

// A signature as the analysis would give it: a (const float*, float*) kernel
// whose first pointer escaped.
KernelSignature twoPointers() {
  KernelSignature s;
  s.name = "_Z1kPKfPf";
  s.paramBytes = 16;
  s.sources = kFromPtx;
  for (uint32_t i = 0; i < 2; ++i) {
    ParamSignature p;
    p.ordinal = i;
    p.name = "_Z1kPKfPf_param_" + std::to_string(i);
    p.offset = 8 * i;
    p.size = 8;
    PointerWord w;
    w.offset = 8 * i;
    p.words.push_back(w);
    s.params.push_back(p);
  }
  s.params[0].words[0].escapes = true;
  s.params[0].words[0].access = Access::kReadWrite;
  s.params[1].words[0].escapes = true;
  s.params[1].words[0].observed = Access::kWrite;
  s.params[1].words[0].access = Access::kReadWrite;
  return s;
}

TEST(Signature, DeclarationNarrowsAnEscapedConstPointer) {
  KernelSignature s = twoPointers();
  DeclaredKernel k;
  k.name = s.name;
  k.params = {DeclaredParam{0, "const float *", {{0, "const float *"}}, {{0, true}}},
              DeclaredParam{1, "float *", {{0, "float *"}}, {{0, false}}}};
  ASSERT_THAT(applyDeclaration(s, k), IsOk());
  EXPECT_EQ(s.sources, kFromPtx | kFromSourceScan);
  EXPECT_TRUE(s.params[0].words[0].declaredConst);
  EXPECT_EQ(s.params[0].words[0].declaredType, "const float *");
  EXPECT_EQ(s.params[0].words[0].access, Access::kRead);
  EXPECT_EQ(s.params[1].words[0].access, Access::kReadWrite);
}

TEST(Signature, DeclarationNeverDropsAStoreThePtxSaw) {
  KernelSignature s = twoPointers();
  DeclaredKernel k;
  k.name = s.name;
  // Declared const, yet the kernel stores through it (a const_cast).
  k.params = {DeclaredParam{0, "int", {}, {}},
              DeclaredParam{1, "const float *", {{0, "const float *"}}, {{0, true}}}};
  ASSERT_THAT(applyDeclaration(s, k), IsOk());
  EXPECT_EQ(s.params[1].words[0].access, Access::kReadWrite);  // write seen + read
  EXPECT_EQ(s.params[0].words[0].access, Access::kReadWrite);  // nothing declared
}

TEST(Signature, DeclarationThatDoesNotFitIsRefused) {
  KernelSignature s = twoPointers();
  DeclaredKernel k;
  k.name = s.name;
  k.params = {DeclaredParam{0, "float *", {{0, "float *"}}, {{0, false}}}};
  EXPECT_THAT(applyDeclaration(s, k),
              StatusIs(Code::kInvalidArgument, HasSubstr("declared with 1 parameters, the PTX has 2")));

  k.params = {DeclaredParam{0, "S", {{4, "float *"}}, {{4, false}}},
              DeclaredParam{1, "float *", {}, {}}};
  EXPECT_THAT(applyDeclaration(s, k),
              StatusIs(Code::kInvalidArgument, HasSubstr("no pointer word at byte 4")));
  EXPECT_EQ(s.sources, kFromPtx);
}

constexpr std::string_view kDatabase = R"({
  "version": 1,
  "kernels": [
    {"name": "_Z1kPKfPf", "params": [
      {"ordinal": 0, "type": "const float *", "pointers": [{"offset": 0, "type": "const float *", "const": true}]},
      {"ordinal": 1, "type": "float *", "pointers": [{"offset": 0, "type": "float *"}]}
    ]},
    {"name": "structs", "params": [
      {"ordinal": 0, "type": "Params", "pointers": [
        {"offset": 0, "type": "const float *"}, {"offset": 8, "type": "float *", "const": false}]}
    ]}
  ]
})";

TEST(SignatureDatabase, ParsesAndRoundTrips) {
  Result<SignatureDatabase> db = SignatureDatabase::parse(kDatabase);
  ASSERT_THAT(db, IsOk());
  EXPECT_EQ(db->size(), 2u);
  const DeclaredKernel* k = db->find("_Z1kPKfPf");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->params.size(), 2u);
  EXPECT_EQ(k->params[0].pointeeConst.at(0), true);
  EXPECT_EQ(k->params[1].pointeeConst.at(0), false);
  const DeclaredKernel* st = db->find("structs");
  ASSERT_NE(st, nullptr);
  // "const" left out: taken from the type.
  EXPECT_EQ(st->params[0].pointeeConst.at(0), true);
  EXPECT_EQ(st->params[0].pointers.at(8), "float *");
  EXPECT_EQ(db->find("nope"), nullptr);

  Result<SignatureDatabase> again = SignatureDatabase::parse(db->toJson());
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again->find("_Z1kPKfPf"), *k);
  EXPECT_EQ(*again->find("structs"), *st);
}

TEST(SignatureDatabase, AddReplacesByName) {
  SignatureDatabase db;
  db.add({"k", {DeclaredParam{0, "int", {}, {}}}});
  db.add({"k", {}});
  EXPECT_EQ(db.size(), 1u);
  EXPECT_TRUE(db.find("k")->params.empty());
}

TEST(SignatureDatabase, ErrorsSayWhatIsWrong) {
  EXPECT_THAT(SignatureDatabase::parse("{\n  \"version\": 1,\n  \"kernels\": [\n}"),
              StatusIs(Code::kInvalidArgument, HasSubstr("line 4: not valid JSON")));
  EXPECT_THAT(SignatureDatabase::parse("[]"),
              StatusIs(Code::kInvalidArgument, HasSubstr("must be a JSON object")));
  EXPECT_THAT(SignatureDatabase::parse(R"({"version": 2, "kernels": []})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("version 2")));
  EXPECT_THAT(SignatureDatabase::parse(R"({"kernels": []})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("version (missing)")));
  EXPECT_THAT(SignatureDatabase::parse(R"({"version": 1})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("'kernels' must be an array")));
  EXPECT_THAT(SignatureDatabase::parse(R"({"version": 1, "kernels": [{"params": []}]})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("kernels[0]: missing 'name'")));
  EXPECT_THAT(
      SignatureDatabase::parse(
          R"({"version": 1, "kernels": [{"name": "k", "params": [{"ordinal": -1}]}]})"),
      StatusIs(Code::kInvalidArgument,
               HasSubstr("kernels[0] (k).params[0]: 'ordinal' must be a non-negative integer")));
  EXPECT_THAT(
      SignatureDatabase::parse(
          R"({"version": 1, "kernels": [{"name": "k", "params": [{"ordinal": 0, "pointers": [{"offset": 0, "const": "yes"}]}]}]})"),
      StatusIs(Code::kInvalidArgument, HasSubstr("pointers[0]: 'const' must be true or false")));
  EXPECT_THAT(
      SignatureDatabase::parse(
          R"({"version": 1, "kernels": [{"name": "k", "params": [{"ordinal": 0}, {"ordinal": 0}]}]})"),
      StatusIs(Code::kInvalidArgument, HasSubstr("parameter 0 declared twice")));
}

TEST(SignatureDatabase, LoadNamesTheFile) {
  EXPECT_THAT(SignatureDatabase::load("/nonexistent/db.json"),
              StatusIs(Code::kNotFound, HasSubstr("cannot open signature database /nonexistent/db.json")));

  char tmpl[] = "/tmp/phos-sigdb-XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  std::string path = tmpl;
  std::ofstream(path) << "{\"version\": 1,\n \"kernels\": [,]}";
  Result<SignatureDatabase> bad = SignatureDatabase::load(path);
  EXPECT_THAT(bad, StatusIs(Code::kInvalidArgument, HasSubstr(path + ": line 2")));

  std::ofstream(path, std::ios::trunc) << kDatabase;
  Result<SignatureDatabase> good = SignatureDatabase::load(path);
  ASSERT_THAT(good, IsOk());
  EXPECT_EQ(good->size(), 2u);
  std::remove(path.c_str());
}

TEST(Signature, Json) {
  KernelSignature s = twoPointers();
  s.demangled = "k(float const*, float*)";
  s.globals = {{"g", Access::kRead}};
  s.indirect = Access::kWrite;
  s.sources = kFromPtx | kFromMangledName;
  nlohmann::json j = toJson(s);
  EXPECT_EQ(j["name"], "_Z1kPKfPf");
  EXPECT_EQ(j["demangled"], "k(float const*, float*)");
  EXPECT_EQ(j["param_bytes"], 16);
  ASSERT_EQ(j["params"].size(), 2u);
  EXPECT_EQ(j["params"][1]["offset"], 8);
  EXPECT_EQ(j["params"][1]["words"][0]["access"], "readwrite");
  EXPECT_EQ(j["params"][1]["words"][0]["observed"], "write");
  EXPECT_EQ(j["params"][1]["words"][0]["escapes"], true);
  EXPECT_EQ(j["params"][1]["words"][0]["declared_const"], false);
  EXPECT_EQ(j["globals"][0]["name"], "g");
  EXPECT_EQ(j["globals"][0]["access"], "read");
  EXPECT_EQ(j["indirect"], "write");
  EXPECT_EQ(j["sources"], nlohmann::json::array({"ptx", "mangled_name"}));
}

}  // namespace
}  // namespace phos::instrument
