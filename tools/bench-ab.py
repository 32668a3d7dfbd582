#!/usr/bin/env python3
"""Tabulates same-run comparisons of mlakit_bench builds.

Input: the concatenated CSV output (--benchmark_format=csv) of several builds run one after
the other, each block started by a line '#V <build name>' (lines starting with '#' otherwise
are comments; a build may appear several times). Output: one row per shape, one column per
build, every measurement of that build in order (default column: us_graph, the per-call time
of K calls in one CUDA graph; --column us for the event-timed call).

    python3 tools/bench-ab.py docs/data/bench-h200-2026-12-01-6c488c1-ab.txt
    python3 tools/bench-ab.py --column us --builds base,v6 FILE
"""
import argparse
import collections
import csv
import sys


def parse(path, column):
    table = collections.OrderedDict()  # shape -> build -> [values]
    builds = []
    build, header = None, None
    with open(path) as f:
        for line in f:
            if line.startswith('#V'):
                build = line.split()[1]
                if build not in builds:
                    builds.append(build)
                continue
            if line.startswith('#') or not line.strip():
                continue
            if line.startswith('name,'):
                header = next(csv.reader([line]))
                continue
            if not line.startswith('"decode/') or header is None or build is None:
                continue
            row = dict(zip(header, next(csv.reader([line]))))
            value = row.get(column, '')
            if value == '':
                continue
            shape = row['name'].split('/iterations')[0][len('decode/'):]
            table.setdefault(shape, collections.OrderedDict()).setdefault(build, []).append(
                float(value))
    return table, builds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('file')
    ap.add_argument('--column', default='us_graph', help='CSV column (us_graph, us, ...)')
    ap.add_argument('--builds', default='', help='comma-separated builds to show, in order')
    args = ap.parse_args()
    table, builds = parse(args.file, args.column)
    if args.builds:
        builds = [b for b in args.builds.split(',') if b]
    if not table:
        print('no decode rows with column %r in %s' % (args.column, args.file), file=sys.stderr)
        return 1
    width = max(len(s) for s in table) + 2
    print(('%-' + str(width) + 's') % ('shape (%s)' % args.column) +
          ''.join('%24s' % b for b in builds))
    for shape, per_build in table.items():
        cells = []
        for b in builds:
            vals = per_build.get(b, [])
            cells.append('%24s' % (' '.join('%.1f' % v for v in vals) if vals else '-'))
        print(('%-' + str(width) + 's') % shape + ''.join(cells))
    return 0


if __name__ == '__main__':
    sys.exit(main())
