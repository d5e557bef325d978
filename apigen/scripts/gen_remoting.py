#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Generates the call serializers of the shim (client) and phosd (server) from apigen's model of cuda.h.
"""Usage: gen_remoting.py CUDA_API_JSON REMOTING_JSON {client|server|report} OUTPUT [--handles HEADER]

CUDA_API_JSON is apigen's model of cuda.h (the one source of truth for the API
surface); REMOTING_JSON (apigen/remoting.json) names the entry points that are
handwritten ("custom") or not remoted yet ("excluded"). Every other entry point
whose parameters all have a generic encoding gets a generated serializer:

  client  shim side: one function per entry point with the cuda.h signature that
          encodes the call into a ring slot, waits for the reply and decodes the
          outputs; installGenerated() puts them in the dispatch table.
  server  daemon side: one function per entry point that decodes the call,
          translates virtual handles, checks device pointers against the
          session, calls the driver and encodes the reply.
  report  a text list: generated / posted / custom / excluded / no generic encoding (why).

--handles also writes the enum of handle types the session's handle table tags ids with.

The encoding of each parameter is documented in common/include/phos/common/ipc/wire.h.
"""
import json
import sys

SCALARS = {
    'int', 'unsigned int', 'unsigned long', 'unsigned long long', 'long long', 'long',
    'float', 'double', 'short', 'unsigned short', 'unsigned char', 'signed char',
}
# Structs with no pointer inside, safe to copy by value across processes.
PLAIN_STRUCTS = {
    'struct CUuuid_st', 'struct CUdevprop_st', 'struct CUmemLocation_st',
}


def handle_struct(canonical):
    """'struct CUctx_st *' -> 'CUctx_st' (the handle's type)."""
    t = canonical.replace('const ', '').strip()
    if t.startswith('struct ') and t.endswith('*') and t.count('*') == 1:
        return t[len('struct '):-1].strip()
    return None


def pointee(canonical):
    t = canonical.strip()
    assert t.endswith('*')
    return t[:-1].strip()


def encoding(entry, param):
    """(rule, detail) for a parameter, or (None, why) when it has no generic encoding."""
    kind, canonical, direction = param['kind'], param['canonicalType'], param['direction']
    written = param['type'].strip()
    if kind == 'value':
        if written in ('CUdeviceptr_v1',):
            return None, f"{param['name']}: 32-bit device pointer (legacy ABI)"
        if written == 'CUdeviceptr':
            return 'deviceptr', None
        if canonical.startswith('struct ') or canonical.startswith('union '):
            if canonical not in PLAIN_STRUCTS:
                return None, f"{param['name']}: struct {canonical} passed by value"
        return 'value', None
    if kind == 'handle':
        return 'handle', handle_struct(canonical)
    if kind in ('callback', 'address'):
        return None, f"{param['name']}: {kind}"
    target = pointee(canonical)
    base = target.replace('const ', '').strip()
    if direction == 'in':
        if target == 'const char':
            return 'string', None
        if base in PLAIN_STRUCTS:
            return 'in', None
        return None, f"{param['name']}: in pointer to {target} (single value or array?)"
    if base == 'char' or base.startswith('void'):
        return None, f"{param['name']}: {direction} pointer to {target}"
    h = handle_struct(base)
    if h is not None and direction == 'out':
        return 'out_handle', h
    if base in SCALARS or base.startswith('enum ') or base in PLAIN_STRUCTS:
        return ('out' if direction == 'out' else 'inout'), None
    return None, f"{param['name']}: {direction} pointer to {target}"


def classify(model, policy):
    custom, excluded = policy['custom'], policy['excluded']
    out = []
    seen = set()
    for e in model['entryPoints']:
        name, sym = e['publicName'], e['symbol']
        if not sym.startswith('cu') or sym in seen:
            continue
        seen.add(sym)
        if name in custom:
            out.append((e, 'custom', custom[name], None))
            continue
        # The longest prefix: "cuLaunchHostFunc" is not the pre-CUDA-4 "cuLaunch".
        prefix = max((p for p in excluded if name.startswith(p)), key=len, default=None)
        if prefix is not None:
            out.append((e, 'excluded', excluded[prefix], None))
            continue
        if e['origin'] == 'legacy':
            out.append((e, 'excluded', 'an older ABI revision', None))
            continue
        rules, why = [], []
        for p in e['params']:
            rule, detail = encoding(e, p)
            if rule is None:
                why.append(detail)
            rules.append((p, rule, detail))
        if why:
            out.append((e, 'none', '; '.join(why), None))
        else:
            out.append((e, 'posted' if name in policy.get('posted', {}) else 'generated', '', rules))
    return out


def enumerator(symbol):
    return 'k' + symbol[0].upper() + symbol[1:]


def decl(param, name):
    """A C declaration of a local holding the parameter's type."""
    return f"{param['type']} {name}"


HEADER = ('// Generated by apigen/scripts/gen_remoting.py from {json} and apigen/remoting.json; do not edit.\n')

PRELUDE = '''// cuda.h as the driver itself is built, so every exported symbol (and the
// _ptds/_ptsz variants) is declared under its own name.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
'''


def emit_client(classified, json_path):
    o = [HEADER.format(json=json_path)]
    o.append('// The shim side of every generically remoted entry point (see wire.h).\n')
    o.append(PRELUDE)
    o.append('#include "client_call.h"\n\n')
    o.append('namespace phos::shim::generated {\nnamespace {\n\n')
    o.append('using cuda_api::EntryPointId;\n\n')
    installs = []
    for e, status, _, rules in classified:
        if status not in ('generated', 'posted'):
            continue
        sym = e['symbol']
        params = ', '.join(f"{p['type']} {p['name']}" for p in e['params'])
        o.append(f'CUresult {sym}_remote({params}) {{\n')
        o.append(f'  ClientCall call(EntryPointId::{enumerator(sym)});\n')
        posted = status == 'posted'
        if rules:
            o.append('  ipc::Encoder& args = call.args();\n')
        for p, rule, _ in rules:
            n = p['name']
            if rule in ('value', 'deviceptr'):
                o.append(f'  args.value({n});\n')
            elif rule == 'handle':
                o.append(f'  args.u64(ClientCall::handleId({n}));\n')
            elif rule == 'string':
                o.append(f'  args.string({n});\n')
            elif rule in ('in', 'inout'):
                o.append(f'  args.inPointer({n});\n')
            elif rule in ('out', 'out_handle'):
                o.append(f'  args.outPointer({n});\n')
        if posted:
            o.append('  return call.post();\n}\n')
            o.append(f'static_assert(std::is_same_v<decltype(&{sym}_remote), decltype(&::{sym})>);\n\n')
            installs.append(sym)
            continue
        o.append('  ReplyReader reply = call.run();\n')
        o.append('  if (!reply.ok()) return reply.result();\n')
        for p, rule, _ in rules:
            n = p['name']
            if rule in ('out', 'inout'):
                o.append(f'  reply.out({n});\n')
            elif rule == 'out_handle':
                o.append(f'  reply.outHandle({n});\n')
        o.append('  return reply.finish();\n}\n')
        o.append(f'static_assert(std::is_same_v<decltype(&{sym}_remote), decltype(&::{sym})>);\n\n')
        installs.append(sym)
    o.append('}  // namespace\n\n')
    o.append('void installGenerated(cuda_api::Dispatch& table) {\n')
    for sym in installs:
        o.append(f'  table.install(EntryPointId::{enumerator(sym)}, cuda_api::toSlot(&{sym}_remote));\n')
    o.append('}\n\n')
    o.append(f'int generatedCount() {{ return {len(installs)}; }}\n\n')
    o.append('}  // namespace phos::shim::generated\n')
    return ''.join(o)


def emit_server(classified, json_path):
    o = [HEADER.format(json=json_path)]
    o.append('// The daemon side of every generically remoted entry point (see wire.h).\n')
    o.append(PRELUDE)
    o.append('#include "server_call.h"\n\n')
    o.append('namespace phos::daemon::generated {\nnamespace {\n\n')
    o.append('using cuda_api::EntryPointId;\n\n')
    entries = []
    for e, status, _, rules in classified:
        if status not in ('generated', 'posted'):
            continue
        sym = e['symbol']
        per_thread = 'true' if e['origin'] == 'per-thread' else 'false'
        o.append(f'void {sym}_serve(ServerCall& call) {{\n')
        if rules:
            o.append('  ipc::Decoder& args = call.args();\n')
        call_args = []
        for i, (p, rule, detail) in enumerate(rules):
            v = f'a{i}'
            if rule == 'value':
                o.append(f"  auto {v} = args.value<{p['type']}>();\n")
                call_args.append(v)
            elif rule == 'deviceptr':
                o.append(f"  auto {v} = args.value<CUdeviceptr>();\n")
                call_args.append(v)
            elif rule == 'handle':
                o.append(f"  {p['type']} {v}{{}};\n")
                o.append(f"  const uint64_t {v}Id = args.u64();\n")
                call_args.append(v)
            elif rule == 'string':
                o.append(f'  bool {v}Null = false;\n')
                o.append(f'  const std::string {v}Text = ServerCall::text(args.blob(&{v}Null));\n')
                call_args.append(f'{v}Null ? nullptr : {v}Text.c_str()')
            elif rule in ('in', 'inout'):
                t = pointee(p['type']).replace('const ', '').strip()
                o.append(f'  const bool {v}Present = args.present();\n')
                o.append(f'  {t} {v}{{}};\n')
                o.append(f'  if ({v}Present) {v} = args.value<{t}>();\n')
                call_args.append(f'{v}Present ? &{v} : nullptr')
            elif rule in ('out', 'out_handle'):
                t = pointee(p['type']).strip()
                o.append(f'  const bool {v}Present = args.present();\n')
                o.append(f'  {t} {v}{{}};\n')
                call_args.append(f'{v}Present ? &{v} : nullptr')
        o.append('  if (!call.argumentsComplete()) return;\n')
        # A driver older than cuda.h lacks newer entry points: never a call through NULL.
        o.append(f'  if (!call.driverTable().has(EntryPointId::{enumerator(sym)})) {{\n')
        o.append('    call.fail(CUDA_ERROR_NOT_SUPPORTED);\n')
        o.append('    return;\n')
        o.append('  }\n')
        for i, (p, rule, detail) in enumerate(rules):
            v = f'a{i}'
            if rule == 'handle':
                if detail == 'CUstream_st':
                    o.append(f'  if (!call.resolveStream({v}Id, {per_thread}, &{v})) return;\n')
                else:
                    o.append(f'  if (!call.resolve(HandleType::k{detail}, {v}Id, &{v})) return;\n')
            elif rule == 'deviceptr':
                o.append(f'  if (!call.checkDevicePointer({v})) return;\n')
        o.append(f'  const CUresult result = call.driver<decltype(&::{sym})>(EntryPointId::{enumerator(sym)})(\n')
        o.append('      ' + ',\n      '.join(call_args) + ');\n' if call_args else '      );\n')
        has_outputs = any(rule in ('out', 'inout', 'out_handle') for _, rule, _ in rules)
        o.append('  ipc::Encoder& reply = call.reply(result);\n' if has_outputs else '  call.reply(result);\n')
        for i, (p, rule, detail) in enumerate(rules):
            v = f'a{i}'
            if rule in ('out', 'inout'):
                o.append(f'  reply.u8({v}Present);\n')
                o.append(f'  if ({v}Present) reply.value({v});\n')
            elif rule == 'out_handle':
                o.append(f'  reply.u8({v}Present);\n')
                o.append(f'  if ({v}Present) reply.u64(call.exportHandle(HandleType::k{detail}, result, {v}));\n')
        o.append('  call.send();\n}\n\n')
        entries.append(sym)
    o.append('}  // namespace\n\n')
    o.append('void installGenerated(ServerTable& table) {\n')
    for sym in entries:
        o.append(f'  table[static_cast<size_t>(EntryPointId::{enumerator(sym)})] = &{sym}_serve;\n')
    o.append('}\n\n')
    o.append(f'int generatedCount() {{ return {len(entries)}; }}\n\n')
    o.append('}  // namespace phos::daemon::generated\n')
    return ''.join(o)


def handle_types(classified):
    types = set()
    for e, status, _, rules in classified:
        if status in ('generated', 'posted'):
            for p, rule, detail in rules:
                if rule in ('handle', 'out_handle') and detail != 'CUstream_st':
                    types.add(detail)
    return sorted(types)


def emit_handle_types(classified, json_path):
    o = [HEADER.format(json=json_path)]
    o.append('// The handle types the generated serializers translate; the session keeps\n')
    o.append('// one table of virtual ids tagged with these.\n#pragma once\n\n#include <cstdint>\n\n')
    o.append('namespace phos::daemon {\n\nenum class HandleType : uint16_t {\n  kNone = 0,\n')
    # Types the handwritten code needs as well, even if no generated call uses them.
    types = sorted(set(handle_types(classified)) | {'CUctx_st', 'CUmod_st', 'CUfunc_st', 'CUstream_st',
                                                    'CUevent_st', 'CUlib_st', 'CUkern_st'})
    for t in types:
        o.append(f'  k{t},\n')
    o.append('};\n\nconst char* handleTypeName(HandleType type);\n\n}  // namespace phos::daemon\n')
    o.append('\n#ifdef PHOS_HANDLE_TYPE_NAMES\nnamespace phos::daemon {\nconst char* handleTypeName(HandleType type) {\n  switch (type) {\n')
    o.append('    case HandleType::kNone: return "none";\n')
    for t in types:
        o.append(f'    case HandleType::k{t}: return "{t}";\n')
    o.append('  }\n  return "?";\n}\n}  // namespace phos::daemon\n#endif\n')
    return ''.join(o)


def emit_report(classified):
    o = []
    for status in ('generated', 'posted', 'custom', 'excluded', 'none'):
        rows = [(e['symbol'], why) for e, s, why, _ in classified if s == status]
        o.append(f'# {status}: {len(rows)}\n')
        for sym, why in rows:
            o.append(f'{sym}\t{why}\n' if why else f'{sym}\n')
    return ''.join(o)


def main() -> int:
    argv = sys.argv[1:]
    handles_out = None
    if '--handles' in argv:
        i = argv.index('--handles')
        handles_out = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) != 4 or argv[2] not in ('client', 'server', 'report'):
        sys.exit(__doc__)
    api_json, remoting_json, what, output = argv
    with open(api_json, encoding='utf-8') as f:
        model = json.load(f)
    with open(remoting_json, encoding='utf-8') as f:
        policy = json.load(f)
    symbols = {e['publicName'] for e in model['entryPoints']}
    for section in ('custom', 'posted', 'excluded'):
        for name in policy.get(section, {}):
            if section in ('custom', 'posted') and name not in symbols:
                sys.exit(f'{remoting_json}: custom entry point {name} is not in cuda.h')
            if section == 'excluded' and not any(s.startswith(name) for s in symbols):
                sys.exit(f'{remoting_json}: excluded prefix {name} matches no entry point')
    classified = classify(model, policy)
    text = {
        'client': lambda: emit_client(classified, api_json),
        'server': lambda: emit_server(classified, api_json),
        'report': lambda: emit_report(classified),
    }[what]()
    with open(output, 'w', encoding='utf-8') as f:
        f.write(text)
    if handles_out is not None:
        with open(handles_out, 'w', encoding='utf-8') as f:
            f.write(emit_handle_types(classified, api_json))
    return 0


if __name__ == '__main__':
    sys.exit(main())
