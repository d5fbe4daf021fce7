"""What a fresh page costs on this machine, by how much memory the process already holds.

Maps CHUNK MiB at a time (anonymous memory), writes every byte (the kernel zeroes each page on its first touch), and
keeps each chunk, up to TOTAL: the seconds per GiB of each chunk. On the VMs these benchmarks run on, the first
GiBs of a process cost ~0.5-0.73 s/GiB and what lies beyond ~2.8-3 s/GiB: the host backs only so much of the guest's
free memory, and a page it no longer backs is a host fault too. How much it backs moves from minute to minute (the
"spells" of benchmarks/results/HISTORY.md): ~1.5-2.2 GiB on the AMD host of 2026-12-05 02:00-03:40; on the Intel
host of 04:00, 0.75 GiB in one run and more than 2.75 GiB in the run right after it (the memory the first had just
touched was still backed). A breakdown's time therefore depends on its peak memory more than on its
count of page faults: a page freed and taken again is cheap, a new high-water mark is not.

    python benchmarks/fresh_pages.py [--chunk-mib 256] [--total-gib 3] [--repeat 2]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import time


def run(chunk: int, total: int) -> list[float]:
    held, out = [], []
    for _ in range(total // chunk):
        m = mmap.mmap(-1, chunk)
        buf = (ctypes.c_char * chunk).from_buffer(m)
        t = time.perf_counter()
        ctypes.memset(ctypes.addressof(buf), 1, chunk)
        out.append((time.perf_counter() - t) * (1 << 30) / chunk)
        del buf
        held.append(m)
    for m in held:
        m.close()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunk-mib", type=int, default=256)
    p.add_argument("--total-gib", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", action="store_true", help="one JSON line per run instead of text")
    a = p.parse_args(argv)
    chunk, total = a.chunk_mib << 20, int(a.total_gib * (1 << 30))
    for _ in range(a.repeat):
        s = run(chunk, total)
        if a.json:
            print(json.dumps({"chunk_mib": a.chunk_mib, "s_per_gib": [round(x, 3) for x in s]}))
        else:
            print("s/GiB by chunk of the process' memory:", " ".join(f"{x:.2f}" for x in s))


if __name__ == "__main__":
    main()
