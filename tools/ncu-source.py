#!/usr/bin/env python3
"""Splits the warp-state samples of one kernel's SASS into regions between synchronisation points.

Input: the CSV that ncu writes for the source page of a report taken with the SourceCounters
section, for example (on the GPU machine):

    ncu --section SourceCounters -k regex:decode_kernel_kt --launch-skip 2 --launch-count 1 \\
        -o kt ./mlakit_bench --quick --benchmark_filter='decode/h16/q8/fp8/b128/kv8192/ps64/'
    ncu -i kt.ncu-rep --page source --csv --print-source sass > kt-sass.csv

Output (default): one line per region of the instruction listing, a region starting at each
named barrier (BAR.SYNC / BAR.ARV / BAR.RED), mbarrier wait (SYNCS.PHASECHK), wgmma wait for
all groups (WARPGROUP.DEPBAR.LE gsb0, 0x0) and EXIT: its share of all warp samples, its most
frequent stall reasons (shares of all samples) and the instructions it executed per execution
of its first instruction (so a tile loop's regions read as instructions per warp and tile).
Regions under --min-share percent are left out. --top N lists the N instructions with the most
samples instead.

    python3 tools/ncu-source.py kt-sass.csv
    python3 tools/ncu-source.py --top 30 kt-sass.csv
    python3 tools/ncu-source.py --compare other-sass.csv kt-sass.csv   # same kernel, two runs

--compare lists the instructions (by line of the listing, which must be the same code) whose
samples differ most between two reports, e.g. one shape at page size 1 and at page size 64.
"""
import argparse
import collections
import csv
import re
import sys

MARKER = re.compile(r"(BAR\.(SYNC|ARV|RED)[^;]*|SYNCS\.PHASECHK[^,]*|EXIT|"
                    r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0)")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return int(text)
    except ValueError:
        return 0


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header.
    for i, row in enumerate(rows):
        if "Source" in row and SAMPLES in row:
            header = row
            return header, rows[i + 1:]
    sys.exit("%s: no source-page header with '%s' (was SourceCounters collected?)" %
             (path, SAMPLES))


def stall_columns(header):
    return [h for h in header if h.startswith("stall_") and "Not Issued" not in h]


def opcode(source):
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0]


def regions(header, data, min_share):
    isrc, iw, ie = header.index("Source"), header.index(SAMPLES), header.index(EXECUTED)
    stalls = stall_columns(header)
    istall = {c: header.index(c) for c in stalls}
    total = sum(number(r[iw]) for r in data) or 1
    bounds = [0] + [k for k, r in enumerate(data) if k and MARKER.search(r[isrc])] + [len(data)]
    for a, b in zip(bounds, bounds[1:]):
        rows = data[a:b]
        samples = sum(number(r[iw]) for r in rows)
        if 100.0 * samples / total < min_share:
            continue
        reasons = collections.Counter()
        for r in rows:
            for c in stalls:
                reasons[c[6:]] += number(r[istall[c]])
        ops = collections.Counter()
        for r in rows:
            ops[opcode(r[isrc])] += number(r[ie])
        first = max(number(rows[0][ie]), 1)
        mark = MARKER.search(rows[0][isrc])
        label = mark.group(1) if mark and a else "start"
        print("%5d-%-5d %6.2f%%  %-44s %s" % (
            a, b, 100.0 * samples / total, label[:44],
            " ".join("%s %.1f" % (k, 100.0 * v / total) for k, v in reasons.most_common(3) if v)))
        mix = " ".join("%s:%.0f" % (k, v / first) for k, v in ops.most_common(8))
        print("%13s instructions per execution of line %d: %.0f (%s)" % (
            "", a, sum(ops.values()) / first, mix))
    print("total samples: %d" % total)


def top(header, data, count):
    isrc, iw, ie = header.index("Source"), header.index(SAMPLES), header.index(EXECUTED)
    stalls = stall_columns(header)
    total = sum(number(r[iw]) for r in data) or 1
    ranked = sorted(range(len(data)), key=lambda k: -number(data[k][iw]))[:count]
    for k in ranked:
        r = data[k]
        reasons = sorted(((c[6:], number(r[header.index(c)])) for c in stalls),
                         key=lambda x: -x[1])[:3]
        print("%5d %6.2f%% %9s  %-58s %s" % (
            k, 100.0 * number(r[iw]) / total, r[ie], r[isrc].strip()[:58],
            " ".join("%s:%d" % x for x in reasons if x[1])))


def compare(path_a, path_b, count):
    ha, da = load(path_a)
    hb, db = load(path_b)
    ia, ib = ha.index(SAMPLES), hb.index(SAMPLES)
    isrc = ha.index("Source")
    ta = sum(number(r[ia]) for r in da) or 1
    tb = sum(number(r[ib]) for r in db) or 1
    n = min(len(da), len(db))
    print("samples: %d (%s) and %d (%s)" % (ta, path_a, tb, path_b))
    ranked = sorted(range(n), key=lambda k: -abs(number(db[k][ib]) - number(da[k][ia])))[:count]
    for k in ranked:
        print("%5d %7d %7d  %s" % (k, number(da[k][ia]), number(db[k][ib]),
                                   da[k][isrc].strip()[:70]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=0, help="list the N instructions with most samples")
    ap.add_argument("--min-share", type=float, default=0.5,
                    help="leave out regions under this percent of the samples (default 0.5)")
    ap.add_argument("--compare", metavar="CSV",
                    help="a second report of the same code: list the largest differences")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare, args.csv, args.top or 25)
        return 0
    header, data = load(args.csv)
    if args.top:
        top(header, data, args.top)
    else:
        regions(header, data, args.min_share)
    return 0


if __name__ == "__main__":
    sys.exit(main())
