// SPDX-License-Identifier: Apache-2.0
#include "opcode_coverage.h"

#include <array>

namespace phos::vgpu::engine {
namespace {

using ptx::Opcode;
constexpr Coverage E = Coverage::kExecuted;
constexpr Coverage S = Coverage::kSomeForms;
constexpr Coverage F = Coverage::kFaultsWhenRun;
constexpr Coverage L = Coverage::kRefusedAtLoad;

constexpr std::string_view kNothing = "executed as nothing: a hint that changes nothing a kernel computes";
constexpr std::string_view kClusters = "distributed shared memory: clusters of more than one CTA are not run";
constexpr std::string_view kVideo = "the video instructions are not executed";
constexpr std::string_view kTextureForms =
    "texture objects, 1d/2d/3d: point and linear filtering, every addressing mode, normalized "
    "coordinates; "
    "array, cube and multisample geometries, .level and .grad fault";
constexpr std::string_view kSurfaceForms =
    "surface objects, .b (binary) 1d/2d/3d with .trap, .clamp and .zero; .p (formatted) and "
    "layered forms fault";
constexpr std::string_view kQueryForms =
    "width, height, depth (and for txq normalized_coords, filter_mode, addr_mode_N); the others "
    "fault";
constexpr std::string_view kAtomicForms = "scalar forms of 16, 32 and 64 bits (f16/bf16 adds included); .b128 and vector forms fault";
constexpr std::string_view kMemoryForms = "every state space, scalars and .v2/.v4 vectors; .b128 accesses fault";
constexpr std::string_view kNoStack = "the PTX stack (alloca, stacksave, stackrestore) is not executed";

constexpr std::array kTable = {
    OpcodeCoverage{Opcode::kAbs, E, ""},
    OpcodeCoverage{Opcode::kActivemask, E, ""},
    OpcodeCoverage{Opcode::kAdd, E, ""},
    OpcodeCoverage{Opcode::kAddc, E, ""},
    OpcodeCoverage{Opcode::kAlloca, F, kNoStack},
    OpcodeCoverage{Opcode::kAnd, E, ""},
    OpcodeCoverage{Opcode::kApplypriority, E, kNothing},
    OpcodeCoverage{Opcode::kAtom, S, kAtomicForms},
    OpcodeCoverage{Opcode::kBar, E, ""},
    OpcodeCoverage{Opcode::kBarrier, E, "barrier.cluster included: a cluster is one CTA"},
    OpcodeCoverage{Opcode::kBfe, E, ""},
    OpcodeCoverage{Opcode::kBfi, E, ""},
    OpcodeCoverage{Opcode::kBfind, E, ""},
    OpcodeCoverage{Opcode::kBmsk, E, ""},
    OpcodeCoverage{Opcode::kBra, E, ""},
    OpcodeCoverage{Opcode::kBrev, E, ""},
    OpcodeCoverage{Opcode::kBrkpt, E, "executed as nothing: no debugger is attached"},
    OpcodeCoverage{Opcode::kBrx, L, "brx.idx jump tables are not executed"},
    OpcodeCoverage{Opcode::kCall, S,
                   "direct calls and uniform indirect ones; divergent indirect calls fault"},
    OpcodeCoverage{Opcode::kClz, E, ""},
    OpcodeCoverage{Opcode::kCnot, E, ""},
    OpcodeCoverage{Opcode::kCopysign, E, ""},
    OpcodeCoverage{Opcode::kCos, E, ""},
    OpcodeCoverage{Opcode::kCp, S,
                   "cp.async, and cp.async.bulk without tensor maps; the .tensor, multicast, "
                   "prefetch and reduce "
                   "forms are refused at load or fault"},
    OpcodeCoverage{Opcode::kCreatepolicy, E, kNothing},
    OpcodeCoverage{Opcode::kCvt, S,
                   "integer and float types, f16x2/bf16x2 and fp8 pairs, tf32 by .rna/.rn/.rz; "
                   "fp6, fp4, ue8m0, "
                   ".rs and tf32 by .rm/.rp fault"},
    OpcodeCoverage{Opcode::kCvta, E, ""},
    OpcodeCoverage{Opcode::kDiscard, E,
                   "executed as nothing: the ISA leaves the discarded bytes indeterminate, and "
                   "keeping them is one "
                   "of the values allowed"},
    OpcodeCoverage{Opcode::kDiv, E, ""},
    OpcodeCoverage{Opcode::kDp2a, E, ""},
    OpcodeCoverage{Opcode::kDp4a, E, ""},
    OpcodeCoverage{Opcode::kElect, E, ""},
    OpcodeCoverage{Opcode::kEx2, E, ""},
    OpcodeCoverage{Opcode::kExit, E, ""},
    OpcodeCoverage{Opcode::kFence, E, ""},
    OpcodeCoverage{Opcode::kFma, E, ""},
    OpcodeCoverage{Opcode::kFns, E, ""},
    OpcodeCoverage{Opcode::kGetctarank, F, kClusters},
    OpcodeCoverage{Opcode::kGriddepcontrol, E,
                   "exact as nothing: a launch starts once its stream's work is done"},
    OpcodeCoverage{Opcode::kIsspacep, E, ""},
    OpcodeCoverage{
        Opcode::kIstypep, E,
        "whether a handle names a texture (texref, samplerref) or surface object of the context"},
    OpcodeCoverage{Opcode::kLd, S, kMemoryForms},
    OpcodeCoverage{
        Opcode::kLdmatrix, S,
        "m8n8 .x1/.x2/.x4 of .b16, with and without .trans; other shapes are refused at load"},
    OpcodeCoverage{Opcode::kLdu, S, kMemoryForms},
    OpcodeCoverage{Opcode::kLg2, E, ""},
    OpcodeCoverage{Opcode::kLop3, E, ""},
    OpcodeCoverage{Opcode::kMad, E, ""},
    OpcodeCoverage{Opcode::kMad24, E, ""},
    OpcodeCoverage{Opcode::kMadc, E, ""},
    OpcodeCoverage{Opcode::kMapa, F, kClusters},
    OpcodeCoverage{Opcode::kMatch, E, ""},
    OpcodeCoverage{Opcode::kMax, E, ""},
    OpcodeCoverage{Opcode::kMbarrier, E, ""},
    OpcodeCoverage{Opcode::kMembar, E, ""},
    OpcodeCoverage{Opcode::kMin, E, ""},
    OpcodeCoverage{Opcode::kMma, S,
                   "mma.sync m16n8k16 and m16n8k8 .row.col, f16 or bf16 inputs, f16 or f32 "
                   "accumulators; other "
                   "shapes and types fault"},
    OpcodeCoverage{Opcode::kMov, E, ""},
    OpcodeCoverage{Opcode::kMovmatrix, E, "m8n8.trans.b16, its one form"},
    OpcodeCoverage{Opcode::kMul, E, ""},
    OpcodeCoverage{Opcode::kMul24, E, ""},
    OpcodeCoverage{Opcode::kMultimem, L, "multicast memory is not executed"},
    OpcodeCoverage{Opcode::kNanosleep, E, ""},
    OpcodeCoverage{Opcode::kNeg, E, ""},
    OpcodeCoverage{Opcode::kNot, E, ""},
    OpcodeCoverage{Opcode::kOr, E, ""},
    OpcodeCoverage{Opcode::kPmevent, E, "executed as nothing: there are no profiler counters"},
    OpcodeCoverage{Opcode::kPopc, E, ""},
    OpcodeCoverage{Opcode::kPrefetch, E, kNothing},
    OpcodeCoverage{Opcode::kPrefetchu, E, kNothing},
    OpcodeCoverage{Opcode::kPrmt, E, ""},
    OpcodeCoverage{Opcode::kRcp, E, ""},
    OpcodeCoverage{Opcode::kRed, S, kAtomicForms},
    OpcodeCoverage{Opcode::kRedux, E, ""},
    OpcodeCoverage{Opcode::kRem, E, ""},
    OpcodeCoverage{Opcode::kRet, E, ""},
    OpcodeCoverage{Opcode::kRsqrt, E, ""},
    OpcodeCoverage{Opcode::kSad, E, ""},
    OpcodeCoverage{Opcode::kSelp, E, ""},
    OpcodeCoverage{Opcode::kSet, E, ""},
    OpcodeCoverage{Opcode::kSetmaxnreg, F, "register reallocation (sm_90a) is not executed"},
    OpcodeCoverage{Opcode::kSetp, E, ""},
    OpcodeCoverage{Opcode::kShf, E, ""},
    OpcodeCoverage{Opcode::kShfl, E, ""},
    OpcodeCoverage{Opcode::kShl, E, ""},
    OpcodeCoverage{Opcode::kShr, E, ""},
    OpcodeCoverage{Opcode::kSin, E, ""},
    OpcodeCoverage{Opcode::kSlct, E, ""},
    OpcodeCoverage{Opcode::kSqrt, E, ""},
    OpcodeCoverage{Opcode::kStackrestore, F, kNoStack},
    OpcodeCoverage{Opcode::kStacksave, F, kNoStack},
    OpcodeCoverage{Opcode::kSt, S, kMemoryForms},
    OpcodeCoverage{Opcode::kStmatrix, S,
                   "m8n8 .x1/.x2/.x4 of .b16, with and without .trans; .m16n8 of .b8 faults"},
    OpcodeCoverage{Opcode::kSub, E, ""},
    OpcodeCoverage{Opcode::kSubc, E, ""},
    OpcodeCoverage{Opcode::kSuld, S, kSurfaceForms},
    OpcodeCoverage{Opcode::kSured, F, "surface reductions are not executed"},
    OpcodeCoverage{Opcode::kSust, S, kSurfaceForms},
    OpcodeCoverage{Opcode::kSuq, S, kQueryForms},
    OpcodeCoverage{Opcode::kSzext, E, ""},
    OpcodeCoverage{Opcode::kTanh, E, ""},
    OpcodeCoverage{Opcode::kTensormap, L, "tensor-map updates (sm_90a) are not executed"},
    OpcodeCoverage{Opcode::kTestp, E, "zeros count as normal numbers, as the ISA says"},
    OpcodeCoverage{Opcode::kTex, S, kTextureForms},
    OpcodeCoverage{Opcode::kTld4, S, "2d gathers of texture objects; other geometries fault"},
    OpcodeCoverage{Opcode::kTrap, E, ""},
    OpcodeCoverage{Opcode::kTxq, S, kQueryForms},
    OpcodeCoverage{Opcode::kVabsdiff, F, kVideo},
    OpcodeCoverage{Opcode::kVabsdiff2, F, kVideo},
    OpcodeCoverage{Opcode::kVabsdiff4, F, kVideo},
    OpcodeCoverage{Opcode::kVadd, F, kVideo},
    OpcodeCoverage{Opcode::kVadd2, F, kVideo},
    OpcodeCoverage{Opcode::kVadd4, F, kVideo},
    OpcodeCoverage{Opcode::kVavrg2, F, kVideo},
    OpcodeCoverage{Opcode::kVavrg4, F, kVideo},
    OpcodeCoverage{Opcode::kVmad, F, kVideo},
    OpcodeCoverage{Opcode::kVmax, F, kVideo},
    OpcodeCoverage{Opcode::kVmax2, F, kVideo},
    OpcodeCoverage{Opcode::kVmax4, F, kVideo},
    OpcodeCoverage{Opcode::kVmin, F, kVideo},
    OpcodeCoverage{Opcode::kVmin2, F, kVideo},
    OpcodeCoverage{Opcode::kVmin4, F, kVideo},
    OpcodeCoverage{Opcode::kVote, E, ""},
    OpcodeCoverage{Opcode::kVset, F, kVideo},
    OpcodeCoverage{Opcode::kVset2, F, kVideo},
    OpcodeCoverage{Opcode::kVset4, F, kVideo},
    OpcodeCoverage{Opcode::kVshl, F, kVideo},
    OpcodeCoverage{Opcode::kVshr, F, kVideo},
    OpcodeCoverage{Opcode::kVsub, F, kVideo},
    OpcodeCoverage{Opcode::kVsub2, F, kVideo},
    OpcodeCoverage{Opcode::kVsub4, F, kVideo},
    OpcodeCoverage{Opcode::kWgmma, L, "warpgroup MMA (sm_90a) is not executed"},
    OpcodeCoverage{Opcode::kWmma, S,
                   "the shapes and types of the wmma section (f16, bf16, s8/u8, tf32, f64); "
                   "sub-byte and b1 types "
                   "fault"},
    OpcodeCoverage{Opcode::kXor, E, ""},
};

constexpr bool inOpcodeOrder() {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<size_t>(kTable[i].opcode) != i + 1) return false;
  }
  return true;
}
static_assert(kTable.size() == static_cast<size_t>(Opcode::kCount) - 1, "one entry per opcode");
static_assert(inOpcodeOrder(), "entries in the order of ptx::Opcode");

}  // namespace

std::span<const OpcodeCoverage> opcodeCoverage() { return kTable; }

const OpcodeCoverage& coverageOf(ptx::Opcode opcode) {
  return kTable[static_cast<size_t>(opcode) - 1];  // kNone is not an opcode of a lowered instruction
}

std::string_view coverageName(Coverage coverage) {
  switch (coverage) {
    case Coverage::kExecuted: return "executed";
    case Coverage::kSomeForms: return "some forms";
    case Coverage::kFaultsWhenRun: return "faults when run";
    case Coverage::kRefusedAtLoad: return "refused at load";
  }
  return "?";
}

}  // namespace phos::vgpu::engine
