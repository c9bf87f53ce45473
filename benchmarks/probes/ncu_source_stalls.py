"""Summarize Nsight Compute's per-instruction warp-stall samples (its source page, SASS, as CSV).

Capture on a GPU, then summarize anywhere (no GPU needed):

    ncu --clock-control none -k regex:_gl_attn_fwd --launch-skip 1 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o fa python3 benchmarks/probes/fa_ncu.py 64 32768 0
    ncu -i fa.ncu-rep --page source --csv --print-source sass | gzip > fa_src.csv.gz
    python3 benchmarks/probes/ncu_source_stalls.py fa_src.csv.gz [--from 2038 --to 4552] [--top 25]

Prints the stall reasons' shares of all samples (or of the instructions [from, to) of the listing,
e.g. one warp-specialized partition: warps that idle at a barrier, such as the padding warps of a
warp-specialized kernel, otherwise dominate), for the main reasons the opcodes they are charged to,
and the instructions with the most samples.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re


def opcode(source: str) -> str:
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", source)
    return m.group(2) if m else source.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--from", dest="lo", type=int, default=0, help="first instruction (row of the listing)")
    ap.add_argument("--to", dest="hi", type=int, default=None, help="past the last instruction")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(args.csv, "rt")))
    header = next(r for r in rows if "Source" in r and "Address" in r)
    data = rows[rows.index(header) + 1:][args.lo:args.hi]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = lambda r, k: int(r[col[k]] or 0)  # noqa: E731
    by_reason = collections.Counter({k: sum(samples(r, k) for r in data) for k in reasons})
    total = sum(by_reason.values()) or 1
    print(f"{len(data)} instructions, {total} samples")
    print("by reason:", ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10)))
    for k, _ in by_reason.most_common(6):
        ops = collections.Counter()
        for r in data:
            ops[opcode(r[col["Source"]])] += samples(r, k)
        n = sum(ops.values()) or 1
        print(f"  {k[6:]:>14}: " + ", ".join(f"{o} {100 * v / n:.0f}%" for o, v in ops.most_common(6)))
    executed = collections.Counter()
    for r in data:
        executed[opcode(r[col["Source"]])] += int(r[col["Instructions Executed"]] or 0)
    n = sum(executed.values()) or 1
    print("executed:", ", ".join(f"{o} {100 * v / n:.1f}%" for o, v in executed.most_common(12)))
    print("top instructions (row, samples, share, source, main reasons):")
    order = sorted(range(len(data)), key=lambda i: -sum(samples(data[i], k) for k in reasons))
    for i in order[:args.top]:
        r = data[i]
        s = sum(samples(r, k) for k in reasons)
        main3 = sorted(((samples(r, k), k[6:]) for k in reasons), reverse=True)[:3]
        print(f"{args.lo + i:6d} {s:8d} {100 * s / total:5.1f}% {r[col['Source']].strip()[:64]:64s} "
              + ", ".join(f"{k} {v}" for v, k in main3 if v))


if __name__ == "__main__":
    main()
