#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cuts kernels out of a large PTX module into a small, self-contained one.

The corpus's cccl_*.ptx files come from CuPy's prebuilt extension modules,
whose fatbins carry one compute_120 PTX module of 2-27 MB each (CUB, Thrust,
the cuRAND-based random generator). `phos-vgpu-fatbin FILE.so --extract DIR`
writes that PTX; this script keeps the module header, the `.entry` functions
whose names match the given regular expressions, and the module-scope
declarations (globals, shared variables, functions) they name, in their
original order, so that the result parses, loads and assembles on its own.

    extract_entries.py IN.ptx OUT.ptx --origin TEXT REGEX...
"""
import argparse
import re
import sys

ENTRY = re.compile(r"^\.(?:visible |weak )?\.entry\s+([\w$]+)")
DECL = re.compile(r"^(?:\.(?:visible|weak|extern)\s+)*\.(?:global|const|shared)\b.*?([\w$]+)\s*(?:\[|;|=)")
WORD = re.compile(r"[A-Za-z_$][\w$]*")


def split_items(lines):
    """Top-level items: ('header', text), ('entry', name, text), ('decl', name, text)."""
    items, i = [], 0
    while i < len(lines):
        line = lines[i]
        m = ENTRY.match(line)
        if m or line.startswith(".func") or re.match(r"^\.(visible|weak|extern) \.func", line):
            name = m.group(1) if m else re.search(r"\.func\s+(?:\([^)]*\)\s*)?([\w$]+)", line).group(1)
            j, depth, seen_body = i, 0, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                seen_body |= "{" in lines[j]
                if (seen_body and depth == 0) or (not seen_body and lines[j].rstrip().endswith(";")):
                    break
                j += 1
            items.append(("entry" if m else "decl", name, "".join(lines[i:j + 1])))
            i = j + 1
            continue
        d = DECL.match(line)
        if d:
            items.append(("decl", d.group(1), line))
        elif line.startswith((".version", ".target", ".address_size")):
            items.append(("header", None, line))
        i += 1
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--origin", required=True, help="where the module comes from, for the header comment")
    ap.add_argument("patterns", nargs="+")
    args = ap.parse_args()
    with open(args.input) as f:
        items = split_items(f.readlines())
    wanted = [re.compile(p) for p in args.patterns]
    keep = {id(it) for it in items if it[0] == "entry" and any(p.search(it[1]) for p in wanted)}
    if not keep:
        sys.exit("no entry matches " + " ".join(args.patterns))
    decls = {it[1]: it for it in items if it[0] == "decl"}
    # Declarations named by what is kept, transitively.
    todo = [it for it in items if id(it) in keep]
    while todo:
        for word in set(WORD.findall(todo.pop()[2])):
            d = decls.get(word)
            if d is not None and id(d) not in keep:
                keep.add(id(d))
                todo.append(d)
    out = ["//\n", f"// {args.origin}\n",
           "// Cut down with tests/corpus/extract_entries.py to the kernels matching:\n"]
    out += [f"//   {p}\n" for p in args.patterns]
    out.append("//\n\n")
    for it in items:
        if it[0] == "header" or id(it) in keep:
            out.append(it[2] if it[2].endswith("\n") else it[2] + "\n")
            if it[0] != "header":
                out.append("\n")
    with open(args.output, "w") as f:
        f.writelines(out)
    kernels = sum(1 for it in items if it[0] == "entry" and id(it) in keep)
    print(f"{args.output}: {kernels} kernels, {sum(len(x) for x in out)} bytes")


if __name__ == "__main__":
    main()
