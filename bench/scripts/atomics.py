#!/usr/bin/env python3
"""Atomic read-modify-write instructions per request, by function, from a callgrind profile.

Why: an atomic RMW (`lock`-prefixed, or `xchg` with memory) counts as one instruction in
callgrind but costs tens of cycles, so instruction counts understate code that clones and drops
`Arc`s, takes locks or bumps shared counters. This VM has no hardware counters to see it
otherwise.

    CALLGRIND_ARGS=--dump-instr=yes bench/scripts/callgrind-proxy.sh weft
    bench/scripts/atomics.py /tmp/callgrind-proxy/callgrind.out.*.1 20000 target/release/weft-proxy

Each executed instruction's count comes from the profile (`--dump-instr=yes` gives counts per
address); the atomic ones are found by disassembling each object with objdump (the proxy binary
given, and libc).
"""
import collections
import re
import subprocess
import sys


def atomic_addresses(path):
    """address -> function name for every atomic RMW instruction in the object at `path`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True, check=True).stdout
    found, fn = {}, "?"
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            fn = m.group(2)
            continue
        m = re.match(r"^\s*([0-9a-f]+):\t(.*)$", line)
        if m and (m.group(2).startswith("lock ") or re.match(r"xchg\s.*\(", m.group(2))):
            found[int(m.group(1), 16)] = fn
    return found


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    profile, requests, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    objects = {}  # object file name (last path part) -> atomic addresses
    for b in binaries + ["/usr/lib/x86_64-linux-gnu/libc.so.6"]:
        objects[b.rsplit("/", 1)[-1]] = atomic_addresses(b)
    names, current, addr, after_call = {}, None, 0, False
    counts = collections.Counter()
    for line in open(profile):
        m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3).rsplit("/", 1)[-1]
            if m.group(1) == "ob":
                current = objects.get(names.get(m.group(2)))
            continue
        if line.startswith("calls="):
            after_call = True  # the next line is the call's inclusive cost
            continue
        if not line or line[0] not in "0123456789+-*":
            continue
        parts = line.split()
        pos = parts[0]
        if pos.startswith("0x"):
            addr = int(pos, 16)
        elif pos[0] in "+-":
            addr += int(pos, 0)
        if after_call:
            after_call = False
            continue
        if current is not None and len(parts) >= 3 and addr in current:
            counts[current[addr]] += int(parts[2])
    total = sum(counts.values())
    print(f"atomic RMW instructions per request: {total / requests:.1f}")
    for fn, n in counts.most_common(25):
        print(f"{n / requests:7.2f}  {re.sub(r'17h[0-9a-f]{16}E$', '', fn)[:140]}")


if __name__ == "__main__":
    main()
