// SPDX-License-Identifier: Apache-2.0
// The one table of PTX spellings (opcodes and modifiers) the AST enums are built from.
#pragma once

// Each list is X(enumerator, "spelling without the leading dot").

#define PHOS_PTX_OPCODES(X)                                                          \
  X(kAbs, "abs") X(kActivemask, "activemask") X(kAdd, "add") X(kAddc, "addc")        \
  X(kAlloca, "alloca") X(kAnd, "and") X(kApplypriority, "applypriority")             \
  X(kAtom, "atom") X(kBar, "bar") X(kBarrier, "barrier") X(kBfe, "bfe")              \
  X(kBfi, "bfi") X(kBfind, "bfind") X(kBmsk, "bmsk") X(kBra, "bra")                  \
  X(kBrev, "brev") X(kBrkpt, "brkpt") X(kBrx, "brx") X(kCall, "call")                \
  X(kClz, "clz") X(kCnot, "cnot") X(kCopysign, "copysign") X(kCos, "cos")            \
  X(kCp, "cp") X(kCreatepolicy, "createpolicy") X(kCvt, "cvt") X(kCvta, "cvta")      \
  X(kDiscard, "discard") X(kDiv, "div") X(kDp2a, "dp2a") X(kDp4a, "dp4a")            \
  X(kElect, "elect") X(kEx2, "ex2") X(kExit, "exit") X(kFence, "fence")              \
  X(kFma, "fma") X(kFns, "fns") X(kGetctarank, "getctarank")                         \
  X(kGriddepcontrol, "griddepcontrol") X(kIsspacep, "isspacep")                      \
  X(kIstypep, "istypep") X(kLd, "ld") X(kLdmatrix, "ldmatrix") X(kLdu, "ldu")        \
  X(kLg2, "lg2") X(kLop3, "lop3") X(kMad, "mad") X(kMad24, "mad24")                  \
  X(kMadc, "madc") X(kMapa, "mapa") X(kMatch, "match") X(kMax, "max")                \
  X(kMbarrier, "mbarrier") X(kMembar, "membar") X(kMin, "min") X(kMma, "mma")        \
  X(kMov, "mov") X(kMovmatrix, "movmatrix") X(kMul, "mul") X(kMul24, "mul24")        \
  X(kMultimem, "multimem") X(kNanosleep, "nanosleep") X(kNeg, "neg")                 \
  X(kNot, "not") X(kOr, "or") X(kPmevent, "pmevent") X(kPopc, "popc")                \
  X(kPrefetch, "prefetch") X(kPrefetchu, "prefetchu") X(kPrmt, "prmt")               \
  X(kRcp, "rcp") X(kRed, "red") X(kRedux, "redux") X(kRem, "rem") X(kRet, "ret")     \
  X(kRsqrt, "rsqrt") X(kSad, "sad") X(kSelp, "selp") X(kSet, "set")                  \
  X(kSetmaxnreg, "setmaxnreg") X(kSetp, "setp") X(kShf, "shf") X(kShfl, "shfl")      \
  X(kShl, "shl") X(kShr, "shr") X(kSin, "sin") X(kSlct, "slct") X(kSqrt, "sqrt")     \
  X(kStackrestore, "stackrestore") X(kStacksave, "stacksave") X(kSt, "st")           \
  X(kStmatrix, "stmatrix") X(kSub, "sub") X(kSubc, "subc") X(kSuld, "suld")          \
  X(kSured, "sured") X(kSust, "sust") X(kSuq, "suq") X(kSzext, "szext")              \
  X(kTanh, "tanh") X(kTensormap, "tensormap") X(kTestp, "testp") X(kTex, "tex")      \
  X(kTld4, "tld4") X(kTrap, "trap") X(kTxq, "txq") X(kVabsdiff, "vabsdiff")          \
  X(kVabsdiff2, "vabsdiff2") X(kVabsdiff4, "vabsdiff4") X(kVadd, "vadd")             \
  X(kVadd2, "vadd2") X(kVadd4, "vadd4") X(kVavrg2, "vavrg2") X(kVavrg4, "vavrg4")    \
  X(kVmad, "vmad") X(kVmax, "vmax") X(kVmax2, "vmax2") X(kVmax4, "vmax4")            \
  X(kVmin, "vmin") X(kVmin2, "vmin2") X(kVmin4, "vmin4") X(kVote, "vote")            \
  X(kVset, "vset") X(kVset2, "vset2") X(kVset4, "vset4") X(kVshl, "vshl")            \
  X(kVshr, "vshr") X(kVsub, "vsub") X(kVsub2, "vsub2") X(kVsub4, "vsub4")            \
  X(kWgmma, "wgmma") X(kWmma, "wmma") X(kXor, "xor")

#define PHOS_PTX_TYPES(X)                                                            \
  X(kB8, "b8") X(kB16, "b16") X(kB32, "b32") X(kB64, "b64") X(kB128, "b128")         \
  X(kU8, "u8") X(kU16, "u16") X(kU32, "u32") X(kU64, "u64")                          \
  X(kS8, "s8") X(kS16, "s16") X(kS32, "s32") X(kS64, "s64")                          \
  X(kF16, "f16") X(kF16x2, "f16x2") X(kF32, "f32") X(kF64, "f64")                    \
  X(kBF16, "bf16") X(kBF16x2, "bf16x2") X(kTF32, "tf32") X(kPred, "pred")            \
  X(kB1, "b1") X(kU4, "u4") X(kS4, "s4") X(kU16x2, "u16x2") X(kS16x2, "s16x2")       \
  X(kE4M3, "e4m3") X(kE5M2, "e5m2") X(kE4M3x2, "e4m3x2") X(kE5M2x2, "e5m2x2")        \
  X(kE2M1x2, "e2m1x2") X(kE2M3x2, "e2m3x2") X(kE3M2x2, "e3m2x2")                     \
  X(kUE8M0x2, "ue8m0x2") X(kF32x2, "f32x2")

#define PHOS_PTX_SPACES(X)                                                           \
  X(kReg, "reg") X(kSreg, "sreg") X(kConst, "const") X(kGlobal, "global")            \
  X(kLocal, "local") X(kParam, "param") X(kShared, "shared") X(kTex, "tex")          \
  X(kSharedCta, "shared::cta") X(kSharedCluster, "shared::cluster")                  \
  X(kParamEntry, "param::entry") X(kParamFunc, "param::func")

#define PHOS_PTX_ROUNDINGS(X)                                                        \
  X(kRn, "rn") X(kRz, "rz") X(kRm, "rm") X(kRp, "rp") X(kRna, "rna") X(kRs, "rs")    \
  X(kRni, "rni") X(kRzi, "rzi") X(kRmi, "rmi") X(kRpi, "rpi")

// "lo", "hi", "ls", "hs" are comparisons only on setp/set/slct: elsewhere .lo/.hi
// are flags (mul.lo), resolved by the parser from the opcode.
#define PHOS_PTX_CMPOPS(X)                                                           \
  X(kEq, "eq") X(kNe, "ne") X(kLt, "lt") X(kLe, "le") X(kGt, "gt") X(kGe, "ge")      \
  X(kLo, "lo") X(kLs, "ls") X(kHi, "hi") X(kHs, "hs") X(kEqu, "equ") X(kNeu, "neu")  \
  X(kLtu, "ltu") X(kLeu, "leu") X(kGtu, "gtu") X(kGeu, "geu") X(kNum, "num")         \
  X(kNan, "nan")

#define PHOS_PTX_BOOLOPS(X) X(kAnd, "and") X(kOr, "or") X(kXor, "xor")

#define PHOS_PTX_ATOMOPS(X)                                                          \
  X(kAnd, "and") X(kOr, "or") X(kXor, "xor") X(kCas, "cas") X(kExch, "exch")         \
  X(kAdd, "add") X(kInc, "inc") X(kDec, "dec") X(kMin, "min") X(kMax, "max")

#define PHOS_PTX_CACHEOPS(X)                                                         \
  X(kCa, "ca") X(kCg, "cg") X(kCs, "cs") X(kLu, "lu") X(kCv, "cv") X(kWb, "wb")      \
  X(kWt, "wt")

#define PHOS_PTX_SEMS(X)                                                             \
  X(kWeak, "weak") X(kVolatile, "volatile") X(kRelaxed, "relaxed")                   \
  X(kAcquire, "acquire") X(kRelease, "release") X(kAcqRel, "acq_rel") X(kSc, "sc")   \
  X(kMmio, "mmio")

#define PHOS_PTX_SCOPES(X)                                                           \
  X(kCta, "cta") X(kCluster, "cluster") X(kGpu, "gpu") X(kSys, "sys")

#define PHOS_PTX_FLAGS(X)                                                            \
  X(kSat, "sat") X(kFtz, "ftz") X(kApprox, "approx") X(kFull, "full")                \
  X(kUni, "uni") X(kWide, "wide") X(kHi, "hi") X(kLo, "lo") X(kCc, "cc")             \
  X(kSync, "sync") X(kAligned, "aligned") X(kArrive, "arrive") X(kRed, "red")        \
  X(kPopc, "popc") X(kAll, "all") X(kAny, "any") X(kBallot, "ballot")                \
  X(kUp, "up") X(kDown, "down") X(kBfly, "bfly") X(kIdx, "idx") X(kNc, "nc")         \
  X(kTo, "to") X(kL, "l") X(kR, "r") X(kWrap, "wrap") X(kClamp, "clamp")             \
  X(kF4e, "f4e") X(kB4e, "b4e") X(kRc8, "rc8") X(kEcl, "ecl") X(kEcr, "ecr")         \
  X(kRc16, "rc16") X(kGl, "gl") X(kWarp, "warp") X(kAsync, "async")                  \
  X(kCommitGroup, "commit_group") X(kWaitGroup, "wait_group")                        \
  X(kWaitAll, "wait_all") X(kBulk, "bulk") X(kRelu, "relu")                          \
  X(kNaN, "NaN") X(kXorsign, "xorsign") X(kAbs, "abs") X(kOob, "oob")        \
  X(kSatfinite, "satfinite") X(kTrans, "trans") X(kX1, "x1") X(kX2, "x2")            \
  X(kX4, "x4") X(kM8n8, "m8n8") X(kM16n8k8, "m16n8k8") X(kM16n8k16, "m16n8k16")      \
  X(kM16n8k32, "m16n8k32") X(kM16n8k4, "m16n8k4") X(kM8n8k4, "m8n8k4")               \
  X(kM16n16k16, "m16n16k16") X(kM32n8k16, "m32n8k16") X(kM8n32k16, "m8n32k16")       \
  X(kM16n16k8, "m16n16k8") X(kRow, "row") X(kCol, "col") X(kLoad, "load")            \
  X(kStore, "store") X(kA, "a") X(kB, "b") X(kC, "c") X(kD, "d")                     \
  X(kShiftamt, "shiftamt") X(kProxy, "proxy") X(kAlias, "alias")                     \
  X(kGeneric, "generic") X(kNoinc, "noinc")                 \
  X(kL1EvictNormal, "L1::evict_normal") X(kL1EvictUnchanged, "L1::evict_unchanged")  \
  X(kL1EvictFirst, "L1::evict_first") X(kL1EvictLast, "L1::evict_last")             \
  X(kL1NoAllocate, "L1::no_allocate") X(kL2EvictNormal, "L2::evict_normal")          \
  X(kL2EvictFirst, "L2::evict_first") X(kL2EvictLast, "L2::evict_last")              \
  X(kL2CacheHint, "L2::cache_hint") X(kL264B, "L2::64B") X(kL2128B, "L2::128B")      \
  X(kL2256B, "L2::256B") X(kMbarrierCompleteTxBytes, "mbarrier::complete_tx::bytes") \
  X(kInit, "init") X(kInval, "inval") X(kTestWait, "test_wait")                      \
  X(kTryWait, "try_wait") X(kExpectTx, "expect_tx") X(kParity, "parity")             \
  X(kPendingCount, "pending_count") X(kNoComplete, "noComplete")                     \
  X(kArriveDrop, "arrive_drop") X(kCompleteTx, "complete_tx")                        \
  X(kMbarrier, "mbarrier") X(kBulkGroup, "bulk_group") X(kRead, "read")             \
  X(kNoftz, "noftz") X(kLevelL1, "L1") X(kLevelL2, "L2")                             \
  X(kLaunchDependents, "launch_dependents") X(kWait, "wait")                         \
  X(kFractional, "fractional") X(kLastUse, "last_use") X(kEvictLast, "evict_last")   \
  X(kEvictNormal, "evict_normal") X(kEvictFirst, "evict_first")                      \
  X(kEvictUnchanged, "evict_unchanged") X(kUnified, "unified") X(kPack, "pack")      \
  X(kLevelEvictionPriority, "level::eviction_priority")                              \
  X(kCtaGroup1, "cta_group::1") X(kCtaGroup2, "cta_group::2") X(kShift, "shift")     \
  X(kTrunc, "trunc") X(kExtract, "extract") X(kInsert, "insert")                     \
  X(kNoreturn, "noreturn") X(kMulti, "multi") X(kMma, "mma")                        \
  X(kFinite, "finite") X(kInfinite, "infinite") X(kNumber, "number")                 \
  X(kNotanumber, "notanumber") X(kNormal, "normal") X(kSubnormal, "subnormal")       \
  X(kGeom1d, "1d") X(kGeom2d, "2d") X(kGeom3d, "3d") X(kGeomA1d, "a1d")              \
  X(kGeomA2d, "a2d") X(kGeomCube, "cube") X(kGeomAcube, "acube")                     \
  X(kGeom2dms, "2dms") X(kGeomA2dms, "a2dms") X(kTrap, "trap") X(kZero, "zero")      \
  X(kP, "p") X(kG, "g") X(kLevel, "level") X(kGrad, "grad") X(kWidth, "width")       \
  X(kHeight, "height") X(kDepth, "depth") X(kChannelDataType, "channel_data_type")   \
  X(kChannelOrder, "channel_order") X(kNormalizedCoords, "normalized_coords")        \
  X(kForceUnnormalizedCoords, "force_unnormalized_coords")                           \
  X(kFilterMode, "filter_mode") X(kAddrMode0, "addr_mode_0")                         \
  X(kAddrMode1, "addr_mode_1") X(kAddrMode2, "addr_mode_2")                          \
  X(kArraySize, "array_size") X(kNumMipmapLevels, "num_mipmap_levels")               \
  X(kNumSamples, "num_samples") X(kTexref, "texref") X(kSamplerref, "samplerref")     \
  X(kSurfref, "surfref")
