// SPDX-License-Identifier: Apache-2.0
// The range check every instrumented access of a twin calls (docs/twins.md):
// its PTX text, which place_twins puts in every twin module, and its flags.
// vgpu runs a call to exactly this function natively (docs/vgpu-engine.md); a
// function of this name with any other body is interpreted as written.
//
// Arguments: the address, the size in bytes, flags (kCheckFlag*), the
// instruction and function indices for the report, then the validator values.
// A binary search finds the last RangeEntry beginning at or before the address;
// the access is allowed when that entry and the entries right after it cover
// [address, address + size) without a gap and all grant the needed access bits.
// Otherwise the violation is appended to the report (ReportHeader then
// ReportEntry[capacity], twin.h). No linkage directive: the function stays local
// to the module, so several -rdc modules can each carry one.
#pragma once

#include <cstdint>
#include <string_view>

namespace phos::instrument {

inline constexpr std::string_view kCheckFunctionName = "__phos_check";

// Bits of the `flags` argument.
inline constexpr uint32_t kCheckFlagKindMask = 0xF;         // ViolationKind
inline constexpr uint32_t kCheckFlagNeedShift = 4;          // RangeEntry::access bits needed (2 bits)
inline constexpr uint32_t kCheckFlagGlobalSpace = 1u << 8;  // .global address: cvta to generic
inline constexpr uint32_t kCheckFlagGeneric = 1u << 9;      // generic: check only if global

inline constexpr std::string_view kCheckFunctionText = R"(
.func __phos_check(
	.param .b64 __phos_check_address,
	.param .b32 __phos_check_size,
	.param .b32 __phos_check_flags,
	.param .b32 __phos_check_instruction,
	.param .b32 __phos_check_function,
	.param .b64 __phos_check_ranges,
	.param .b32 __phos_check_range_count,
	.param .b64 __phos_check_report
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<16>;

	ld.param.b64 	%rd1, [__phos_check_address];
	ld.param.b32 	%r1, [__phos_check_size];
	ld.param.b32 	%r2, [__phos_check_flags];
	ld.param.b32 	%r3, [__phos_check_instruction];
	ld.param.b32 	%r4, [__phos_check_function];
	ld.param.b64 	%rd2, [__phos_check_ranges];
	ld.param.b32 	%r5, [__phos_check_range_count];
	ld.param.b64 	%rd3, [__phos_check_report];
	and.b32 	%r6, %r2, 256;
	setp.ne.b32 	%p1, %r6, 0;
	@%p1 cvta.global.u64 	%rd1, %rd1;
	and.b32 	%r6, %r2, 512;
	setp.eq.b32 	%p1, %r6, 0;
	@%p1 bra 	$__phos_is_global;
	isspacep.global 	%p2, %rd1;
	@!%p2 bra 	$__phos_done;
$__phos_is_global:
	and.b32 	%r7, %r2, 15;
	shr.u32 	%r8, %r2, 4;
	and.b32 	%r8, %r8, 3;
	cvt.u64.u32 	%rd4, %r1;
	add.s64 	%rd5, %rd1, %rd4;
	cvta.to.global.u64 	%rd6, %rd2;
	mov.b32 	%r9, 0;
	mov.b32 	%r10, %r5;
$__phos_search:
	setp.ge.u32 	%p1, %r9, %r10;
	@%p1 bra 	$__phos_found;
	add.s32 	%r11, %r9, %r10;
	shr.u32 	%r11, %r11, 1;
	mul.wide.u32 	%rd7, %r11, 24;
	add.s64 	%rd8, %rd6, %rd7;
	ld.global.u64 	%rd9, [%rd8];
	setp.gt.u64 	%p1, %rd9, %rd1;
	add.s32 	%r12, %r11, 1;
	selp.b32 	%r10, %r11, %r10, %p1;
	selp.b32 	%r9, %r9, %r12, %p1;
	bra 	$__phos_search;
$__phos_found:
	setp.eq.u32 	%p1, %r9, 0;
	@%p1 bra 	$__phos_violation;
	add.s32 	%r11, %r9, -1;
	mov.b64 	%rd10, %rd1;
$__phos_cover:
	mul.wide.u32 	%rd7, %r11, 24;
	add.s64 	%rd8, %rd6, %rd7;
	ld.global.u64 	%rd9, [%rd8];
	ld.global.u64 	%rd11, [%rd8+8];
	ld.global.u32 	%r13, [%rd8+16];
	setp.gt.u64 	%p1, %rd9, %rd10;
	@%p1 bra 	$__phos_violation;
	setp.le.u64 	%p1, %rd11, %rd10;
	@%p1 bra 	$__phos_violation;
	and.b32 	%r14, %r13, %r8;
	setp.ne.b32 	%p1, %r14, %r8;
	@%p1 bra 	$__phos_violation;
	setp.ge.u64 	%p1, %rd11, %rd5;
	@%p1 bra 	$__phos_done;
	mov.b64 	%rd10, %rd11;
	add.s32 	%r11, %r11, 1;
	setp.ge.u32 	%p1, %r11, %r5;
	@%p1 bra 	$__phos_violation;
	bra 	$__phos_cover;
$__phos_violation:
	cvta.to.global.u64 	%rd12, %rd3;
	atom.global.add.u32 	%r15, [%rd12], 1;
	ld.global.u32 	%r6, [%rd12+4];
	setp.ge.u32 	%p1, %r15, %r6;
	@%p1 bra 	$__phos_done;
	mul.wide.u32 	%rd13, %r15, 24;
	add.s64 	%rd14, %rd12, %rd13;
	st.global.u64 	[%rd14+8], %rd1;
	st.global.u32 	[%rd14+16], %r3;
	st.global.u32 	[%rd14+20], %r7;
	st.global.u32 	[%rd14+24], %r4;
	st.global.u32 	[%rd14+28], %r1;
$__phos_done:
	ret;
}
)";

}  // namespace phos::instrument
