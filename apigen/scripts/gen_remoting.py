#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Generates the whole shim-daemon wire from apigen's model of cuda.h and apigen/remoting.json.
"""Usage: gen_remoting.py CUDA_API_JSON REMOTING_JSON OUTDIR

CUDA_API_JSON is apigen's model of cuda.h (the one source of truth for the API
surface). REMOTING_JSON (apigen/remoting.json) says, per public entry point
name, what is special about it; docs/remoting.md explains the annotations.
Every variant of a name (_v2, _ptds, _ptsz, an older ABI revision with the same
signature) is generated from that one annotation.

Writes into OUTDIR:
  wire_messages.h    per remoted symbol, its request and reply messages and
                     their encoding (put/get): the one definition of the wire
  remote_client.cpp  the shim: per symbol, a function with the cuda.h
                     signature that fills the request, sends it and applies
                     the reply; installGenerated() fills the dispatch table
                     with them and with the shim's local answers
  client_hooks.h     what the shim writes by hand: local answers, prologues,
                     epilogues and "post this call?" predicates
  remote_server.cpp  phosd: per symbol, decode, translate handles, check
                     pointers, call the driver or the handwritten hook, reply
  server_hooks.h     the hooks phosd writes by hand
  handle_types.h     the handle types the session's handle table tags ids with
  remoting_report.txt  every entry point and how it is served

Any inconsistency stops the build: an annotation naming an unknown entry
point, parameter or encoding; an entry point that is neither remoted, local
nor excluded; a remoted one matched by an excluded prefix; an encoding that
needs a hook on an entry without one. A hook the annotation promises and no
code defines fails at link time.
"""
import json
import os
import sys

SCALARS = {
    'int', 'unsigned int', 'unsigned long', 'unsigned long long', 'long long', 'long',
    'float', 'double', 'short', 'unsigned short', 'unsigned char', 'signed char',
}
# Structs with no pointer inside, safe to copy by value across processes.
PLAIN_STRUCTS = {
    'struct CUuuid_st', 'struct CUdevprop_st', 'struct CUmemLocation_st', 'struct CUgraphEdgeData_st',
}
# Encodings whose meaning only a handwritten server hook can give.
HOOK_ONLY = {'address', 'image', 'file_image', 'out_handle_array', 'out_bytes',
             'out_bytes_array', 'kernel_params', 'launch_config', 'descriptor', 'skip', 'in_value', 'jit_options',
             'kernel_node'}
# Encodings of arrays whose count parameter is a size_t* the driver updates
# (cuGraphGetNodes): only generated server functions fill them.
LISTS = {'out_handles', 'out_list'}
# Encodings that take an argument: the parameter holding a count, or a type.
WITH_ARGUMENT = {'array', 'out_array', 'out_handle_array', 'out_string', 'out_bytes_array', 'in_as', 'in_value',
                 'jit_options', 'handles'} | LISTS
ENCODINGS = {'value', 'deviceptr', 'handle', 'stream', 'function', 'string', 'in', 'in_as', 'out', 'inout',
             'out_handle', 'out_cstring'} | HOOK_ONLY | WITH_ARGUMENT
# Reply extras: 'jit' is a link state's JIT outputs (its logs, phos/common/ipc/jit_options.h).
EXTRA_TYPES = {'u32': 'uint32_t', 'u64': 'uint64_t', 'string': 'ipc::Text', 'jit': 'ipc::JitOutputs'}
# Largest string buffer phosd lends the driver for an out_string parameter.
MAX_OUT_STRING = 4096


class Error(Exception):
    pass


def handle_struct(canonical):
    """'struct CUctx_st *' -> 'CUctx_st' (the handle's type)."""
    t = canonical.replace('const ', '').strip()
    if t.startswith('struct ') and t.endswith('*') and t.count('*') == 1:
        return t[len('struct '):-1].strip()
    return None


def pointee(written):
    t = written.strip()
    assert t.endswith('*'), written
    return t[:-1].strip()


def bare(t):
    return t.replace('const ', '').strip()


def enumerator(symbol):
    return 'k' + symbol[0].upper() + symbol[1:]


class Param:
    def __init__(self, p):
        self.name = p['name']
        self.type = p['type'].strip()
        self.canonical = p['canonicalType']
        self.kind = p['kind']
        self.direction = p['direction']
        self.enc = None      # encoding name
        self.arg = None      # its argument (a count parameter or a type)
        self.handle = None   # the handle struct for handle encodings
        self.less = 0  # "array:n-k": an array of k elements fewer than n (the strides between n dimensions: n-1)

    def default_encoding(self):
        """(encoding, None) or (None, why there is no generic one)."""
        kind, canonical, direction = self.kind, self.canonical, self.direction
        if kind == 'value':
            if self.type == 'CUdeviceptr_v1':
                return None, f'{self.name}: 32-bit device pointer (legacy ABI)'
            if self.type == 'CUdeviceptr':
                return 'deviceptr', None
            if (canonical.startswith('struct ') or canonical.startswith('union ')) and canonical not in PLAIN_STRUCTS:
                return None, f'{self.name}: struct {canonical} passed by value'
            return 'value', None
        if kind == 'handle':
            h = handle_struct(canonical)
            if h == 'CUstream_st':
                return 'stream', None
            if h == 'CUfunc_st':
                return 'function', None
            return 'handle', None
        if kind in ('callback', 'address'):
            return None, f'{self.name}: {kind}'
        target = pointee(canonical)
        base = bare(target)
        if direction == 'in':
            if target == 'const char':
                return 'string', None
            if base in PLAIN_STRUCTS:
                return 'in', None
            return None, f'{self.name}: in pointer to {target} (single value or array?)'
        if base == 'char' or base.startswith('void'):
            return None, f'{self.name}: {direction} pointer to {target}'
        if handle_struct(base) is not None and direction == 'out':
            return 'out_handle', None
        if base in SCALARS or base.startswith('enum ') or base in PLAIN_STRUCTS:
            return ('out' if direction == 'out' else 'inout'), None
        return None, f'{self.name}: {direction} pointer to {target}'


class Entry:
    """One exported symbol and how it is served."""

    def __init__(self, e):
        self.symbol = e['symbol']
        self.public = e['publicName']
        self.origin = e['origin']
        self.params = [Param(p) for p in e['params']]
        self.signature = tuple(p['canonicalType'] for p in e['params'])
        self.status = None    # generated | posted | local | excluded
        self.why = ''
        self.annotation = {}
        self.hook = False
        self.prologue = False
        self.epilogue = False
        self.posted = 'never'
        self.extras = []      # [(name, type)] outputs beyond the parameters
        self.lane = None      # (direction, host parameter(s), byte-count parameter): remoting.json "lane"
        self.requests = []    # [(name, type)] request fields the prologue fills: remoting.json "request"

    def param(self, name):
        return next((p for p in self.params if p.name == name), None)

    @property
    def per_thread(self):
        return self.origin == 'per-thread'

    def outputs(self):
        return [p for p in self.params if p.enc in OUTPUT_ENCODINGS] or self.extras


OUTPUT_ENCODINGS = {'out', 'inout', 'out_handle', 'out_array', 'out_handle_array', 'out_string', 'out_cstring',
                    'out_bytes', 'out_bytes_array', 'jit_options'} | LISTS


def parse_encoding(text):
    enc, _, arg = text.partition(':')
    return enc.strip(), (arg.strip() or None)


def array_count(p, prefix=''):
    """The element count of an "array" parameter, never negative: `prefix` + its count parameter (less p.less)."""
    x = f'{prefix}{p.arg}'
    if p.less:
        return f'({x} > {p.less} ? static_cast<size_t>({x}) - {p.less} : 0)'
    return f'({x} > 0 ? static_cast<size_t>({x}) : 0)'


def jit_arguments(p):
    """'jit_options:count,values' -> (count parameter, values parameter)."""
    count, _, values = p.arg.partition(',')
    return count.strip(), values.strip()


def classify(model, policy, where):
    """Entry objects for every cu* symbol, each with its status and encodings."""
    local, remoted, excluded = policy.get('local', {}), policy.get('remoted', {}), policy.get('excluded', {})
    entries, seen = [], set()
    for e in model['entryPoints']:
        if not e['symbol'].startswith('cu') or e['symbol'] in seen:
            continue
        seen.add(e['symbol'])
        entries.append(Entry(e))
    by_name = {}
    for e in entries:
        by_name.setdefault(e.public, []).append(e)

    # Every name the policy mentions exists; no name is in two sections.
    for section in (local, remoted):
        for name in section:
            if name.startswith('_'):
                continue
            if name not in by_name:
                raise Error(f'{where}: {name} is not an entry point of cuda.h')
    for name in set(local) & set(remoted):
        raise Error(f'{where}: {name} is both local and remoted')
    def matches(key, name):
        # "cuGraph*" is a family of names; "cuLaunch" is that one name.
        return name.startswith(key[:-1]) if key.endswith('*') else name == key

    for key in excluded:
        if not any(matches(key, n) for n in by_name):
            raise Error(f'{where}: excluded {key} matches no entry point')

    def excluded_by(name):
        # The most specific key: "cuMemPoolExport*" before "cuMemPool*".
        return max((k for k in excluded if matches(k, name)), key=len, default=None)

    for name, variants in by_name.items():
        current = {v.signature for v in variants if v.origin != 'legacy'}
        prefix = excluded_by(name)
        if name in local or name in remoted:
            if prefix is not None:
                raise Error(f'{where}: {name} is {"local" if name in local else "remoted"} '
                            f'and excluded (by {prefix})')
        annotation = remoted.get(name, {})
        for v in variants:
            if prefix is not None:
                v.status, v.why = 'excluded', excluded[prefix]
            elif name in local:
                v.status, v.why = 'local', local[name]
            elif (v.origin == 'legacy' and v.signature not in current and isinstance(annotation, dict) and
                  annotation.get('server') == 'hook' and v.symbol not in annotation.get('revisions', [])):
                # An older ABI revision of a hooked entry point needs a hook
                # of its own: served only when the annotation lists it.
                v.status, v.why = 'excluded', 'an older ABI revision'
        if name in local or prefix is not None:
            continue
        if not isinstance(annotation, dict):
            raise Error(f'{where}: remoted.{name} must be an object')
        check_annotation(name, annotation, variants, where)
        for v in variants:
            if v.status is not None:
                continue
            apply_annotation(v, annotation, current, where)
    return entries


ANNOTATION_KEYS = {'why', 'server', 'client', 'posted', 'params', 'reply', 'request', 'revisions', 'lane',
                   'failure_outputs'}
LANE_DIRECTIONS = {'to_device': 'toDevice', 'from_device': 'fromDevice', 'either': 'either'}


def check_annotation(name, a, variants, where):
    unknown = set(a) - ANNOTATION_KEYS
    if unknown:
        raise Error(f'{where}: remoted.{name}: unknown key(s) {", ".join(sorted(unknown))}')
    if a and 'why' not in a:
        raise Error(f'{where}: remoted.{name}: say why it is special ("why")')
    if a.get('server', 'driver') not in ('driver', 'hook'):
        raise Error(f'{where}: remoted.{name}: server must be "hook"')
    for c in a.get('client', []):
        if c not in ('prologue', 'epilogue'):
            raise Error(f'{where}: remoted.{name}: client hooks are "prologue" and "epilogue", not "{c}"')
    if a.get('posted', 'never') not in ('never', 'always', 'hook'):
        raise Error(f'{where}: remoted.{name}: posted must be "always" or "hook"')
    for pname, text in a.get('params', {}).items():
        enc, arg = parse_encoding(text)
        if enc not in ENCODINGS:
            raise Error(f'{where}: remoted.{name}.params.{pname}: unknown encoding "{enc}"')
        if not any(v.param(pname) for v in variants):
            raise Error(f'{where}: remoted.{name}.params: {pname} is not a parameter of {name}')
        if (enc in WITH_ARGUMENT) != (arg is not None):
            raise Error(f'{where}: remoted.{name}.params.{pname}: "{enc}" '
                        + ('needs an argument ("enc:count")' if arg is None else 'takes no argument'))
        if enc in LISTS and a.get('server') == 'hook':
            raise Error(f'{where}: remoted.{name}.params.{pname}: "{enc}" is filled by generated server functions only')
        if enc in HOOK_ONLY and a.get('server') != 'hook':
            raise Error(f'{where}: remoted.{name}.params.{pname}: "{enc}" needs "server": "hook"')
        if enc == 'out_array' and a.get('server') != 'hook':
            # The generated server lends the driver an array of plain values.
            for v in variants:
                q = v.param(pname)
                element = bare(pointee(q.canonical)) if q is not None else None
                if element is not None and not (element in SCALARS or element.startswith('enum ')):
                    raise Error(f'{where}: remoted.{name}.params.{pname}: "out_array" of {element} needs '
                                '"server": "hook" (only arrays of scalars and enums are generated)')
    for pname in a.get('failure_outputs', []):
        if not any(v.param(pname) for v in variants):
            raise Error(f'{where}: remoted.{name}.failure_outputs: {pname} is not a parameter of {name}')
    for symbol in a.get('revisions', []):
        if not any(v.symbol == symbol and v.origin == 'legacy' for v in variants):
            raise Error(f'{where}: remoted.{name}.revisions: {symbol} is not an older revision of {name}')
    for ename, etype in a.get('reply', {}).items():
        if etype not in EXTRA_TYPES:
            raise Error(f'{where}: remoted.{name}.reply.{ename}: type must be one of {", ".join(EXTRA_TYPES)}')
    if 'lane' in a:
        lane = a['lane']
        if not (isinstance(lane, list) and lane and lane[0] in LANE_DIRECTIONS
                and len(lane) == (4 if lane[0] == 'either' else 3)):
            raise Error(f'{where}: remoted.{name}.lane: ["to_device" or "from_device", host parameter, byte count] '
                        'or ["either", destination, source, byte count]')
        if a.get('server') != 'hook':
            raise Error(f'{where}: remoted.{name}.lane: a copy through a lane needs "server": "hook"')
        for pname in lane[1:]:
            if not any(v.param(pname) for v in variants):
                raise Error(f'{where}: remoted.{name}.lane: {pname} is not a parameter of {name}')
    if a.get('reply') and (a.get('server') != 'hook' or 'epilogue' not in a.get('client', [])):
        raise Error(f'{where}: remoted.{name}: reply extras need a server hook and a client epilogue')
    for rname, rtype in a.get('request', {}).items():
        if rtype not in ('u32', 'u64'):
            raise Error(f'{where}: remoted.{name}.request.{rname}: type must be u32 or u64')
    if a.get('request') and (a.get('server') != 'hook' or 'prologue' not in a.get('client', [])):
        raise Error(f'{where}: remoted.{name}: request extras need a server hook and a client prologue')


def apply_annotation(v, a, current, where):
    v.annotation = a
    v.hook = a.get('server') == 'hook'
    v.prologue = 'prologue' in a.get('client', [])
    v.epilogue = 'epilogue' in a.get('client', [])
    v.posted = a.get('posted', 'never')
    v.extras = list(a.get('reply', {}).items())
    v.requests = list(a.get('request', {}).items())
    v.lane = tuple(a['lane']) if 'lane' in a else None
    overrides = a.get('params', {})
    # The launch's `extra` travels with its kernel parameters.
    if any(parse_encoding(t)[0] == 'kernel_params' for t in overrides.values()) and v.param('extra') is not None:
        overrides = dict(overrides, extra='skip')
    missing = []
    for p in v.params:
        if p.name in overrides:
            p.enc, p.arg = parse_encoding(overrides[p.name])
            if p.enc == 'array' and p.arg is not None and '-' in p.arg:
                count, _, less = p.arg.partition('-')
                if not less.strip().isdigit():
                    raise Error(f'{where}: {v.symbol}.{p.name}: "array:{p.arg}": a count less a number, as "n-1"')
                p.arg, p.less = count.strip(), int(less)
        else:
            p.enc, why = p.default_encoding()
            if p.enc is None:
                missing.append(why)
        if p.enc in ('handle', 'out_handle', 'out_handle_array', 'handles', 'out_handles'):
            target = p.canonical if p.enc == 'handle' else pointee(p.canonical)
            if target.endswith('const'):  # const CUgraphNode*: an array of constant handles
                target = target[:-len('const')].strip()
            p.handle = handle_struct(target)
            if p.handle is None:
                raise Error(f'{where}: {v.symbol}.{p.name}: "{p.enc}" on a parameter that is not a handle')
        if p.enc == 'jit_options':
            for q in jit_arguments(p):
                if v.param(q) is None:
                    raise Error(f'{where}: {v.symbol}.{p.name}: "jit_options:count,values": {q} is not a parameter')
        elif p.arg is not None and p.enc != 'in_as' and v.param(p.arg) is None:
            raise Error(f'{where}: {v.symbol}.{p.name}: count parameter {p.arg} does not exist')
        elif p.enc in LISTS and not v.param(p.arg).type.endswith('*'):
            raise Error(f'{where}: {v.symbol}.{p.name}: "{p.enc}" needs a count the driver updates (a pointer)')
    if missing and v.origin == 'legacy' and v.signature not in current:
        v.status, v.why = 'excluded', 'an older ABI revision (' + '; '.join(missing) + ')'
        return
    if missing:
        raise Error(f'{where}: {v.symbol} has no encoding for ' + '; '.join(missing) +
                    ': annotate its parameters in "remoted", or exclude it with a reason')
    if any(p.enc == 'kernel_params' for p in v.params) and v.param('f') is None:
        raise Error(f'{where}: {v.symbol}: kernel_params needs the launch\'s function parameter "f"')
    if v.posted != 'never' and (v.outputs() or v.epilogue):
        raise Error(f'{where}: {v.symbol}: a posted call has no reply, so no outputs and no epilogue')
    v.status = 'posted' if v.posted == 'always' else 'generated'


# ---- code for each encoding ------------------------------------------------------


def request_fields(p):
    t = bare(pointee(p.type)) if p.type.endswith('*') else p.type
    return {
        'value': [(p.type, p.name)], 'deviceptr': [('CUdeviceptr', p.name)],
        'handle': [('uint64_t', p.name)], 'stream': [('uint64_t', p.name)], 'function': [('uint64_t', p.name)],
        'string': [('ipc::Text', p.name)], 'in': [(f'ipc::Optional<{t}>', p.name)],
        'in_as': [(f'ipc::Optional<{p.arg}>', p.name)],
        'out': [('bool', p.name)], 'inout': [(f'ipc::Optional<{t}>', p.name)], 'out_handle': [('bool', p.name)],
        'address': [('uint64_t', p.name)], 'image': [('ipc::ImageRef', p.name)],
        'file_image': [('ipc::ImageRef', p.name)], 'array': [('ipc::Blob', p.name)],
        'out_array': [('bool', p.name)], 'out_handle_array': [('bool', p.name)], 'out_string': [('bool', p.name)],
        'out_cstring': [('bool', p.name)], 'out_bytes': [('bool', p.name)],
        'out_bytes_array': [('ipc::Blob', p.name)], 'kernel_params': [('ipc::KernelArgs', p.name)],
        'launch_config': [('ipc::LaunchConfig', p.name)], 'descriptor': [(f'ipc::Optional<{t}>', p.name)],
        'in_value': [('ipc::Blob', p.name)], 'jit_options': [('ipc::JitOptions', p.name)], 'skip': [],
        'handles': [('ipc::Blob', p.name)], 'out_handles': [('bool', p.name)], 'out_list': [('bool', p.name)],
        'kernel_node': [('ipc::KernelNode', p.name)],
    }[p.enc]


def reply_fields(p):
    t = bare(pointee(p.type)) if p.type.endswith('*') else None
    return {
        'out': [(f'ipc::Optional<{t}>', p.name)], 'inout': [(f'ipc::Optional<{t}>', p.name)],
        'out_handle': [('ipc::Optional<uint64_t>', p.name)], 'out_array': [('ipc::Blob', p.name)],
        'out_handle_array': [('ipc::Blob', p.name)], 'out_string': [('ipc::Text', p.name)],
        'out_cstring': [('ipc::Text', p.name)], 'out_bytes': [('ipc::Blob', p.name)],
        'out_bytes_array': [('ipc::BlobList', p.name)], 'jit_options': [('ipc::JitOutputs', p.name)],
        'out_handles': [('ipc::Blob', p.name)], 'out_list': [('ipc::Blob', p.name)],
    }.get(p.enc, [])


def client_fill(p, e):
    n = p.name
    t = bare(pointee(p.type)) if p.type.endswith('*') else p.type
    enc = p.enc
    if enc in ('value', 'deviceptr'):
        return [f'req.{n} = {n};']
    if enc in ('handle', 'stream', 'function'):
        return [f'req.{n} = ClientCall::handleId({n});']
    if enc == 'string':
        return [f'req.{n} = ipc::Text::of({n});']
    if enc in ('in', 'inout', 'descriptor'):
        return [f'req.{n} = ipc::Optional<{t}>::of({n});']
    if enc == 'in_as':
        return [f'req.{n} = ipc::Optional<{p.arg}>::of(static_cast<const {p.arg}*>({n}));']
    if enc == 'in_value':
        return [f'req.{n} = ipc::Blob::of({n}, ipc::valueBytes({p.arg}));']
    if enc in ('out', 'out_handle', 'out_array', 'out_handle_array', 'out_string', 'out_cstring', 'out_bytes'):
        return [f'req.{n} = {n} != nullptr;']
    if enc in LISTS:
        # The driver updates the count: what the application's array holds is its value before the call.
        return [f'req.{n} = {n} != nullptr;',
                f'const size_t capacity_{n} = {n} != nullptr && {p.arg} != nullptr ? *{p.arg} : 0;']
    if enc == 'handles':
        return [f'std::vector<uint64_t> ids_{n};',
                f'req.{n} = handleIds({n}, {p.arg}, &ids_{n});']
    if enc == 'kernel_node':
        return [f'KernelArgBuffer args_{n};',
                f'if (CUresult r = kernelNode({n}, &args_{n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'address':
        return [f'req.{n} = reinterpret_cast<uintptr_t>({n});']
    if enc == 'image':
        return [f'if (CUresult r = imageRef({n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'file_image':
        return [f'ImageFile file_{n};',
                f'if (CUresult r = readImageFile({n}, &file_{n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'array':
        return [f'req.{n} = ipc::Blob::of({n}, sizeof({t}) * {array_count(p)});']
    if enc == 'out_bytes_array':
        return [f'std::vector<uint8_t> wanted_{n};', f'wantedFlags({n}, {p.arg}, &wanted_{n});',
                f'req.{n} = ipc::Blob::of(wanted_{n}.data(), wanted_{n}.size());']
    if enc == 'kernel_params':
        extra = 'extra' if e.param('extra') is not None else 'nullptr'
        return [f'KernelArgBuffer args_{n};',
                f'if (CUresult r = kernelArgs(f, {n}, {extra}, &args_{n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'launch_config':
        return [f'if (CUresult r = launchConfig({n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'jit_options':
        count, values = jit_arguments(p)
        return [f'JitOptionArrays jit_{n};',
                f'if (CUresult r = encodeJitOptions({count}, {n}, {values}, &jit_{n}, &req.{n}); r != CUDA_SUCCESS) return r;']
    if enc == 'skip':
        return [f'(void){n};']
    raise AssertionError(enc)


def client_apply(p):
    """Writes an output back into the application's memory (the call succeeded)."""
    n = p.name
    t = bare(pointee(p.type)) if p.type.endswith('*') else None
    enc = p.enc
    if enc in ('out', 'inout'):
        return [f'if (rep.{n}.present && {n} != nullptr) *{n} = rep.{n}.value;']
    if enc == 'out_handle':
        return [f'if (rep.{n}.present && {n} != nullptr) *{n} = reinterpret_cast<{t}>(rep.{n}.value);']
    if enc == 'out_array':
        return [f'copyArray(rep.{n}, {n}, {p.arg});']
    if enc == 'out_handle_array':
        return [f'copyHandles(rep.{n}, {n}, {p.arg});']
    if enc == 'out_string':
        return [f'copyString(rep.{n}, {n}, {p.arg});']
    if enc == 'out_cstring':
        return [f'if ({n} != nullptr) *{n} = rep.{n}.null ? nullptr : intern(rep.{n}.view());']
    if enc == 'out_bytes':
        return [f'if ({n} != nullptr) std::memcpy({n}, rep.{n}.bytes.data(), rep.{n}.size());']
    if enc == 'out_bytes_array':
        return [f'copyValues(rep.{n}, {n}, {p.arg});']
    if enc == 'out_handles':
        return [f'copyHandleList(rep.{n}, {n}, capacity_{n});']
    if enc == 'out_list':
        return [f'copyArray(rep.{n}, {n}, capacity_{n});']
    return []


def client_apply_always(p):
    """Outputs the application gets whether the call succeeded or not (a failed compilation's error log)."""
    if p.enc == 'jit_options':
        count, values = jit_arguments(p)
        return [f'applyJitOutputs(rep.{p.name}, {count}, {p.name}, {values});']
    return []


def hook_type(p):
    """The C++ type a server hook receives for the parameter (None: not passed)."""
    t = bare(pointee(p.type)) if p.type.endswith('*') else p.type
    return {
        'value': p.type, 'deviceptr': 'CUdeviceptr', 'handle': f'Handle<{p.type}>', 'stream': 'Handle<CUstream>',
        'function': 'Handle<CUfunction>', 'string': 'const char*', 'in': f'const {t}*',
        'in_as': f'const {p.arg}*', 'out': f'{t}*', 'inout': f'{t}*', 'out_handle': 'uint64_t*',
        'address': 'uint64_t', 'image': 'const ipc::ImageRef&', 'file_image': 'const ipc::ImageRef&',
        'array': f'std::span<const {t}>', 'out_array': f'std::vector<{t}>*',
        'out_handle_array': 'std::vector<uint64_t>*', 'out_string': 'char*', 'out_cstring': 'const char**',
        'out_bytes': 'AttributeValue*', 'out_bytes_array': 'std::span<AttributeValue>',
        'kernel_params': 'const ipc::KernelArgs&', 'launch_config': 'const ipc::LaunchConfig&',
        'descriptor': f'const {t}*', 'in_value': 'std::span<const std::byte>', 'jit_options': 'DriverJitOptions&',
        'skip': None, 'handles': f'std::span<const {t}>', 'kernel_node': 'const ipc::KernelNode&',
    }[p.enc]


def server_prepare(p, e):
    """(lines, argument expression) that decode and check a parameter in phosd."""
    n = p.name
    t = bare(pointee(p.type)) if p.type.endswith('*') else p.type
    enc, hook = p.enc, e.hook
    if enc == 'value':
        return [], f'req.{n}'
    if enc == 'deviceptr':
        return ([] if hook else [f'if (!call.checkDevicePointer(req.{n})) return;']), f'req.{n}'
    if enc in ('handle', 'stream', 'function'):
        ctype = {'stream': 'CUstream', 'function': 'CUfunction'}.get(enc, p.type)
        resolve = {'handle': f'call.resolve(HandleType::k{p.handle}, req.{n}, &{n}.real)',
                   'stream': f'call.resolveStream(req.{n}, {str(e.per_thread).lower()}, &{n}.real)',
                   'function': f'call.resolveFunction(req.{n}, &{n}.real)'}[enc]
        return [f'Handle<{ctype}> {n}{{req.{n}, {{}}}};', f'if (!{resolve}) return;'], (n if hook else f'{n}.real')
    if enc == 'string':
        return [f'const std::string text_{n} = req.{n}.str();'], f'req.{n}.null ? nullptr : text_{n}.c_str()'
    if enc in ('in', 'in_as'):
        return [], f'req.{n}.get()'
    if enc == 'out':
        return [f'{t} {n}{{}};'], f'req.{n} ? &{n} : nullptr'
    if enc == 'inout':
        return [f'{t} {n} = req.{n}.value;'], f'req.{n}.present ? &{n} : nullptr'
    if enc == 'out_handle':
        return ([f'uint64_t {n} = 0;'] if hook else [f'{t} {n}{{}};']), f'req.{n} ? &{n} : nullptr'
    if enc in ('address', 'image', 'file_image', 'launch_config', 'kernel_params', 'kernel_node'):
        return [], f'req.{n}'
    if enc == 'handles':
        return [f'std::vector<{t}> {n};',
                f'if (!call.resolveAll(HandleType::k{p.handle}, req.{n}, req.{p.arg}, &{n})) return;'], \
            (f'std::span<const {t}>({n})' if hook else f'{n}.empty() ? nullptr : {n}.data()')
    if enc in LISTS:
        # Filled up to the count the application passed (bounded by what a reply carries).
        return [f'std::vector<{t}> {n};', f'if (req.{n} && !call.sizeOutList(&{n}, &req.{p.arg})) return;'], \
            f'req.{n} ? {n}.data() : nullptr'
    if enc == 'descriptor':
        return [], f'req.{n}.get()'
    if enc == 'in_value':
        return [], f'req.{n}.bytes'
    if enc == 'jit_options':
        return [f'DriverJitOptions {n};', f'if (!{n}.decode(req.{n})) return call.fail(CUDA_ERROR_INVALID_VALUE);'], n
    if enc == 'skip':
        return [], None
    if enc == 'array':
        count = array_count(p, 'req.')
        # NULL stays NULL (an optional array): the driver or the hook (an empty span) judges it.
        return [f'std::vector<{t}> {n};',
                f'if (req.{n}.size() != 0 && !req.{n}.copyTo(&{n}, {count})) return call.fail(CUDA_ERROR_INVALID_VALUE);'], \
            (f'std::span<const {t}>({n})' if hook else f'{n}.empty() ? nullptr : {n}.data()')
    if enc == 'out_array' and not hook:
        return [f'std::vector<{t}> {n};', f'if (req.{n} && !call.sizeOutArray(&{n}, req.{p.arg})) return;'], \
            f'req.{n} ? {n}.data() : nullptr'
    if enc in ('out_array', 'out_handle_array'):
        et = 'uint64_t' if enc == 'out_handle_array' else t
        return [f'std::vector<{et}> {n};'], f'req.{n} ? &{n} : nullptr'
    if enc == 'out_string':
        return [f'char {n}[{MAX_OUT_STRING}] = {{}};'], f'req.{n} ? {n} : nullptr'
    if enc == 'out_cstring':
        return [f'const char* {n} = nullptr;'], f'req.{n} ? &{n} : nullptr'
    if enc == 'out_bytes':
        return [f'AttributeValue {n};'], f'req.{n} ? &{n} : nullptr'
    if enc == 'out_bytes_array':
        return [f'std::vector<AttributeValue> {n};',
                f'if (!wantedValues(req.{n}, req.{p.arg}, &{n})) return call.fail(CUDA_ERROR_INVALID_VALUE);'], \
            f'std::span<AttributeValue>({n})'
    raise AssertionError(enc)


def server_reply(p, e):
    n = p.name
    enc = p.enc
    if enc in ('out', 'inout'):
        present = f'req.{n}' if enc == 'out' else f'req.{n}.present'
        return [f'rep.{n} = {{{present}, {n}}};']
    if enc == 'out_handle':
        if e.hook:
            return [f'rep.{n} = {{req.{n}, {n}}};']
        return [f'rep.{n} = {{req.{n}, call.exportHandle(HandleType::k{p.handle}, result, {n})}};']
    if enc in ('out_array', 'out_handle_array'):
        return [f'rep.{n} = outArray({n}, req.{p.arg}, result);']
    if enc == 'out_string':
        return [f'rep.{n} = outString({n}, req.{n}, result);']
    if enc == 'out_cstring':
        return [f'rep.{n} = ipc::Text::of(result == CUDA_SUCCESS ? {n} : nullptr);']
    if enc == 'out_bytes':
        return [f'rep.{n} = {n}.blob(result);']
    if enc == 'out_bytes_array':
        return [f'rep.{n} = valueList({n}, result);']
    if enc == 'out_handles':
        return [f'rep.{n} = call.exportList(HandleType::k{p.handle}, {n}, result);']
    if enc == 'out_list':
        return [f'rep.{n} = outArray({n}, {n}.size(), result);']
    if enc == 'jit_options':
        return [f'rep.{n} = {n}.outputs();']
    return []


# ---- emitters --------------------------------------------------------------------

HEADER = '// Generated by apigen/scripts/gen_remoting.py from cuda_api.json and apigen/remoting.json; do not edit.\n'
PRELUDE = '''// cuda.h as the driver itself is built, so every exported symbol (and the
// _ptds/_ptsz variants) is declared under its own name.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <cudaProfiler.h>
'''


def served(entries):
    return [e for e in entries if e.status in ('generated', 'posted')]


def params_decl(e):
    return ', '.join(f'{p.type} {p.name}' for p in e.params)


def emit_messages(entries):
    o = [HEADER, '// The request and reply of every remoted symbol: field types and their encoding\n'
         '// are in phos/common/ipc/wire_codec.h. Shared by libphos.so, phosd and the tests.\n',
         '#pragma once\n\n', PRELUDE, '\n#include <cstdint>\n\n#include "phos/common/ipc/jit_options.h"\n'
         '#include "phos/common/ipc/wire_codec.h"\n\n',
         'namespace phos::wire {\n\n']
    for e in served(entries):
        for kind, fields in (('Request', [f for p in e.params for f in request_fields(p)] +
                              [(EXTRA_TYPES[t], n) for n, t in e.requests]),
                             ('Reply', [f for p in e.params for f in reply_fields(p)] +
                              [(EXTRA_TYPES[t], n) for n, t in e.extras])):
            if kind == 'Reply' and e.status == 'posted':
                continue
            name = f'{e.symbol}_{kind}'
            o.append(f'struct {name} {{\n')
            for t, n in fields:
                o.append(f'  {t} {n}{{}};\n')
            o.append('};\n')
            o.append(f'inline void put(ipc::Encoder& e, const {name}& m) {{\n')
            for _, n in fields:
                o.append(f'  ipc::put(e, m.{n});\n')
            if not fields:
                o.append('  (void)e;\n  (void)m;\n')
            o.append('}\n')
            o.append(f'inline void get(ipc::Decoder& d, {name}& m) {{\n')
            for _, n in fields:
                o.append(f'  ipc::get(d, m.{n});\n')
            if not fields:
                o.append('  (void)d;\n  (void)m;\n')
            o.append('}\n')
        o.append('\n')
    o.append('}  // namespace phos::wire\n')
    return ''.join(o)


def request_decl(e):
    """The request extras a prologue fills, as trailing pointer parameters."""
    return ''.join(f', {EXTRA_TYPES[t]}* {n}' for n, t in e.requests)


def distinct(decls):
    seen, out = set(), []
    for d in decls:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def emit_client_hooks(entries):
    # A per-thread variant (_ptsz/_ptds) of a local answer takes PerThread
    # first: stream 0 is then the calling thread's default stream.
    local = distinct(f'CUresult {e.public}({"PerThread, " if e.per_thread else ""}{params_decl(e)});'
                     for e in entries if e.status == 'local')
    pro = distinct(f'std::optional<CUresult> {e.public}({params_decl(e)}{request_decl(e)});'
                   for e in served(entries) if e.prologue)
    post = distinct(f'bool {e.public}({params_decl(e)});' for e in served(entries) if e.posted == 'hook')
    epi = []
    for e in served(entries):
        if not e.epilogue:
            continue
        extra = ''.join(f'{"std::string_view" if t == "string" else EXTRA_TYPES[t]} {n}, ' for n, t in e.extras)
        epi.append(f'CUresult {e.public}(CUresult result, {extra}{params_decl(e)});')
    o = [HEADER, '// What libphos.so writes by hand around the generated calls (remote_client.cpp):\n'
         '// local answers, prologues (nullopt: go on with the call), epilogues (after\n'
         '// the reply; return the call\'s result) and whether to post a call.\n', '#pragma once\n\n', PRELUDE,
         '\n#include <optional>\n#include <string_view>\n\n#include "phos/common/ipc/jit_options.h"\n\n'
         'namespace phos::shim {\n']
    for ns, decls in (('local', local), ('prologue', pro), ('epilogue', distinct(epi)), ('posted', post)):
        o.append(f'namespace {ns} {{\n')
        if ns == 'local':
            o.append('struct PerThread {};\n')
        o.extend(d + '\n' for d in decls)
        o.append(f'}}  // namespace {ns}\n')
    o.append('}  // namespace phos::shim\n')
    return ''.join(o)


def emit_client(entries):
    o = [HEADER, '// The shim side of every entry point: remoted, answered locally, or refused with its reason.\n',
         PRELUDE,
         '\n#include <cstring>\n#include <vector>\n\n#include "api_trace.h"\n#include "client_call.h"\n'
         '#include "phos/cuda_api/client_hooks.h"\n#include "phos/cuda_api/wire_messages.h"\n#include "wire_support.h"\n\n',
         'namespace phos::shim::generated {\nnamespace {\n\nusing cuda_api::EntryPointId;\nusing trace::Served;\n\n']
    installs = []
    for e in served(entries):
        s = e.symbol
        o.append(f'CUresult {s}_remote({params_decl(e)}) {{\n')
        body = [f'trace::note(EntryPointId::{enumerator(s)}, Served::kRemoted);']
        body.append(f'wire::{s}_Request req;')
        if e.prologue:
            args = [p.name for p in e.params] + [f'&req.{n}' for n, _ in e.requests]
            body.append(f'if (auto r = prologue::{e.public}({", ".join(args)})) return *r;')
        for p in e.params:
            body.extend(client_fill(p, e))
        body.append(f'ClientCall call(EntryPointId::{enumerator(s)});')
        body.append('wire::put(call.args(), req);')
        if e.posted == 'always':
            body.append('return call.post();')
        else:
            if e.posted == 'hook':
                body.append(f'if (posted::{e.public}({", ".join(p.name for p in e.params)})) return call.post();')
            if e.lane:
                body.append(f'ReplyReader reply = call.run(LaneCopy::{LANE_DIRECTIONS[e.lane[0]]}({", ".join(e.lane[1:])}));')
            else:
                body.append('ReplyReader reply = call.run();')
            body.append('if (!reply.ok()) return reply.result();')
            body.append(f'wire::{s}_Reply rep;')
            body.append('wire::get(reply.decoder(), rep);')
            body.append('CUresult result = reply.finish();')
            # Outputs the driver writes whatever the result (why an update failed).
            on_failure = e.annotation.get('failure_outputs', [])
            applies = [line for p in e.params if p.name not in on_failure for line in client_apply(p)]
            body.extend(line for p in e.params if p.name in on_failure for line in client_apply(p))
            if applies:
                body.append('if (result == CUDA_SUCCESS) {')
                body.extend('  ' + line for line in applies)
                body.append('}')
            body.extend(line for p in e.params for line in client_apply_always(p))
            if e.epilogue:
                extras = ''.join(f'rep.{n}{".view()" if t == "string" else ""}, ' for n, t in e.extras)
                args = ', '.join(p.name for p in e.params)
                body.append(f'return epilogue::{e.public}(result, {extras}{args});')
            else:
                body.append('return result;')
        o.extend(f'  {line}\n' for line in body)
        o.append('}\n')
        o.append(f'static_assert(std::is_same_v<decltype(&{s}_remote), decltype(&::{s})>);\n\n')
        installs.append((s, f'&{s}_remote'))
    for e in entries:
        s = e.symbol
        args = ', '.join(p.name for p in e.params)
        if e.status == 'local':
            o.append(f'CUresult {s}_local({params_decl(e)}) {{\n')
            o.append(f'  trace::note(EntryPointId::{enumerator(s)}, Served::kLocal);\n')
            if e.per_thread:
                o.append(f'  return local::{e.public}(local::PerThread{{}}, {args});\n}}\n\n')
            else:
                o.append(f'  return static_cast<decltype(&::{s})>(&local::{e.public})({args});\n}}\n\n')
            installs.append((s, f'&{s}_local'))
        elif e.status == 'excluded':
            unused = ''.join(f'  (void){p.name};\n' for p in e.params)
            o.append(f'CUresult {s}_excluded({params_decl(e)}) {{\n{unused}')
            o.append(f'  return static_cast<CUresult>(trace::excluded(EntryPointId::{enumerator(s)}, {json.dumps(e.why)}));\n}}\n\n')
            installs.append((s, f'&{s}_excluded'))
    o.append('}  // namespace\n\n')
    o.append('void installGenerated(cuda_api::Dispatch& table) {\n')
    for s, fn in installs:
        o.append(f'  table.install(EntryPointId::{enumerator(s)}, cuda_api::toSlot({fn}));\n')
    o.append('}\n\n')
    o.append(f'int generatedCount() {{ return {len(installs)}; }}\n\n')
    o.append('}  // namespace phos::shim::generated\n')
    return ''.join(o)


def hook_decl(e):
    args = ['ServerCall& call'] + [f'{hook_type(p)} {p.name}' for p in e.params if hook_type(p) is not None]
    args += [f'{EXTRA_TYPES[t]} {n}' for n, t in e.requests]
    args += [f'{"std::string" if t == "string" else EXTRA_TYPES[t]}* {n}' for n, t in e.extras]
    return f'CUresult {e.public}({", ".join(args)});'


def emit_server_hooks(entries):
    o = [HEADER, '// The server functions phosd writes by hand (daemon/src/remoting/), one per remoted\n'
         '// name whose annotation says "server": "hook", overloaded where variants\n'
         '// differ. Each gets the decoded arguments (handles resolved, outputs as\n'
         '// pointers to what the reply carries) and returns the call\'s result.\n',
         '#pragma once\n\n', PRELUDE,
         '\n#include <cstdint>\n#include <span>\n#include <string>\n#include <vector>\n\n'
         '#include "phos/cuda_api/wire_messages.h"\n#include "session/driver_jit_options.h"\n'
         '#include "session/server_call.h"\n\n',
         'namespace phos::daemon::hooks {\n']
    o.extend(d + '\n' for d in distinct(hook_decl(e) for e in served(entries) if e.hook))
    o.append('}  // namespace phos::daemon::hooks\n')
    return ''.join(o)


def emit_server(entries):
    o = [HEADER, '// The daemon side of every remoted entry point.\n', PRELUDE,
         '\n#include <string>\n#include <vector>\n\n#include "phos/cuda_api/server_hooks.h"\n'
         '#include "phos/cuda_api/wire_messages.h"\n#include "session/server_call.h"\n\n',
         'namespace phos::daemon::generated {\nnamespace {\n\nusing cuda_api::EntryPointId;\n\n']
    names = []
    for e in served(entries):
        s = e.symbol
        o.append(f'void {s}_serve(ServerCall& call) {{\n')
        body = [f'wire::{s}_Request req;', 'wire::get(call.args(), req);', 'if (!call.argumentsComplete()) return;']
        if not e.hook:
            # A driver older than cuda.h lacks newer entry points: never a call through NULL.
            body.append(f'if (!call.driverTable().has(EntryPointId::{enumerator(s)})) '
                        'return call.fail(CUDA_ERROR_NOT_SUPPORTED);')
        args = []
        overrides = {}
        for p in e.params:
            if p.enc == 'out_string':
                # The driver is told the size of phosd's buffer, never more.
                overrides[p.arg] = f'req.{p.arg} < {MAX_OUT_STRING} ? req.{p.arg} : {MAX_OUT_STRING}'
        for p in e.params:
            lines, expr = server_prepare(p, e)
            body.extend(lines)
            if expr is None:
                continue
            args.append(overrides.get(p.name, expr) if not e.hook else expr)
        args += [f'req.{n}' for n, _ in e.requests]
        for n, t in e.extras:
            body.append(f'{"std::string" if t == "string" else EXTRA_TYPES[t]} {n}{{}};')
            args.append(f'&{n}')
        if e.hook:
            body.append(f'const CUresult result = hooks::{e.public}({", ".join(["call"] + args)});')
            body.append('if (call.answered()) return;')
        else:
            body.append(f'const CUresult result = call.driver<decltype(&::{s})>(EntryPointId::{enumerator(s)})(')
            body.append('    ' + ', '.join(args) + ');')
        replies = [line for p in e.params for line in server_reply(p, e)]
        replies += [f'rep.{n} = {"ipc::Text::of(" + n + ")" if t == "string" else n};' for n, t in e.extras]
        if e.status == 'posted' or not replies:
            body.append('call.reply(result);')
        else:
            body.append(f'wire::{s}_Reply rep;')
            body.extend(replies)
            body.append('wire::put(call.reply(result), rep);')
        body.append('call.send();')
        o.extend(f'  {line}\n' for line in body)
        o.append('}\n\n')
        names.append(s)
    o.append('}  // namespace\n\n')
    o.append('void installGenerated(ServerTable& table) {\n')
    for s in names:
        o.append(f'  table[static_cast<size_t>(EntryPointId::{enumerator(s)})] = &{s}_serve;\n')
    o.append('}\n\n')
    o.append(f'int generatedCount() {{ return {len(names)}; }}\n\n')
    o.append('}  // namespace phos::daemon::generated\n')
    return ''.join(o)


def emit_handle_types(entries):
    types = {p.handle for e in served(entries) for p in e.params if p.handle is not None}
    # Types the handwritten code needs as well, even if no generated call uses them.
    types |= {'CUctx_st', 'CUmod_st', 'CUfunc_st', 'CUstream_st', 'CUevent_st', 'CUlib_st', 'CUkern_st', 'CUgraphNode_st'}
    types = sorted(types)
    o = [HEADER, '// The handle types the session\'s handle table tags ids with.\n#pragma once\n\n#include <cstdint>\n\n',
         'namespace phos::daemon {\n\nenum class HandleType : uint16_t {\n  kNone = 0,\n']
    o.extend(f'  k{t},\n' for t in types)
    o.append('};\n\nconst char* handleTypeName(HandleType type);\n\n}  // namespace phos::daemon\n')
    o.append('\n#ifdef PHOS_HANDLE_TYPE_NAMES\nnamespace phos::daemon {\nconst char* handleTypeName(HandleType type) {\n'
             '  switch (type) {\n    case HandleType::kNone: return "none";\n')
    o.extend(f'    case HandleType::k{t}: return "{t}";\n' for t in types)
    o.append('  }\n  return "?";\n}\n}  // namespace phos::daemon\n#endif\n')
    return ''.join(o)


def emit_report(entries):
    o = []
    groups = [
        ('generated', lambda e: e.status == 'generated' and not e.hook and not e.prologue and not e.epilogue),
        ('generated with handwritten parts', lambda e: e.status == 'generated' and (e.hook or e.prologue or e.epilogue)),
        ('posted', lambda e: e.status == 'posted'),
        ('local', lambda e: e.status == 'local'),
        ('excluded', lambda e: e.status == 'excluded'),
    ]
    for title, test in groups:
        rows = [e for e in entries if test(e)]
        o.append(f'# {title}: {len(rows)}\n')
        for e in rows:
            parts = []
            if e.hook:
                parts.append('server hook')
            if e.prologue:
                parts.append('prologue')
            if e.epilogue:
                parts.append('epilogue')
            if e.posted == 'hook':
                parts.append('posted when the shim says so')
            why = e.why or e.annotation.get('why', '')
            text = '; '.join(parts + ([why] if why else []))
            o.append(f'{e.symbol}\t{text}\n' if text else f'{e.symbol}\n')
    return ''.join(o)


def main() -> int:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    api_json, remoting_json, outdir = sys.argv[1:]
    with open(api_json, encoding='utf-8') as f:
        model = json.load(f)
    try:
        with open(remoting_json, encoding='utf-8') as f:
            policy = json.load(f)
        entries = classify(model, policy, remoting_json)
    except json.JSONDecodeError as e:
        sys.exit(f'{remoting_json}: not valid JSON: {e}')
    except Error as e:
        sys.exit(f'gen_remoting.py: {e}')
    outputs = {
        'wire_messages.h': emit_messages(entries),
        'client_hooks.h': emit_client_hooks(entries),
        'remote_client.cpp': emit_client(entries),
        'server_hooks.h': emit_server_hooks(entries),
        'remote_server.cpp': emit_server(entries),
        'handle_types.h': emit_handle_types(entries),
        'remoting_report.txt': emit_report(entries),
    }
    for name, text in outputs.items():
        with open(os.path.join(outdir, name), 'w', encoding='utf-8') as f:
            f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
