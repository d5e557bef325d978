#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-suite summary of meson's and pytest's JUnit logs, for scripts/test.

Meson names each gtest testsuite "phos.phos:<suite> / <test>.<Case>"; pytest's
log becomes the suite "pytest". Exits non-zero if a log is missing or any test
failed, so a crash that left no log is not mistaken for a pass.
"""
import collections
import sys
import xml.etree.ElementTree as ET


def suite_of(testsuite_name: str, path: str) -> str:
    if "pytest" in path:
        return "pytest"
    # "phos.phos:unit / common_status.Status" -> "unit"
    head = testsuite_name.split(" / ")[0]
    return head.rsplit(":", 1)[-1] if ":" in head else head


def main(paths):
    counts = collections.OrderedDict()
    failed_names = []
    ok = True
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"test-summary: cannot read {path}: {e}")
            ok = False
            continue
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for ts in suites:
            for case in ts.findall("testcase"):
                # Tests that are not gtest programs sit in one testsuite named
                # after the project; their own name carries the suite
                # ("phos:unit / ptx_fuzz_smoke").
                label = case.get("name", "") if ts.get("name") == "phos" else ts.get("name", "")
                name = suite_of(label, path)
                c = counts.setdefault(name, collections.Counter())
                if case.find("failure") is not None or case.find("error") is not None:
                    c["failed"] += 1
                    failed_names.append(f"{name}: {case.get('classname')}.{case.get('name')}")
                elif case.find("skipped") is not None:
                    c["skipped"] += 1
                else:
                    c["passed"] += 1
    print()
    print(f"{'suite':<10} {'passed':>7} {'failed':>7} {'skipped':>8}")
    total = collections.Counter()
    for name, c in counts.items():
        print(f"{name:<10} {c['passed']:>7} {c['failed']:>7} {c['skipped']:>8}")
        total.update(c)
    for n in failed_names:
        print(f"FAILED {n}")
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0 if ok and total["failed"] == 0 and total["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
