#!/usr/bin/env python3
"""Per-kernel GPU time of one decode token, from Nsight Compute's raw CSV.

    ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum ... > k.csv
    python3 bench/cuda/kernel_table.py k.csv [--period N]

The decode step launches the same kernel sequence for every token; the last full repetition of
that sequence (its length found as the shortest period that repeats at the end, or --period) is
one token. Prints each kernel kind's count, total and mean time per token, and the DRAM bytes it
read, then the sum: the GPU time of the token's kernels without the gaps between them, to set
against the measured time per token of the captured graph.
"""
import argparse
import csv
import re
import sys
from collections import OrderedDict


def read_rows(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own log lines too
    rows = list(csv.reader(lines))
    head = rows[0]
    name_col = head.index("Kernel Name")
    cols = {m: head.index(m) for m in ("gpu__time_duration.sum", "dram__bytes_read.sum") if m in head}
    units = rows[1]
    out = []
    for r in rows[2:]:
        if len(r) != len(head):
            continue
        rec = {"name": r[name_col]}
        for m, i in cols.items():
            v = float(r[i].replace(",", "") or 0)
            u = units[i]
            if m.startswith("gpu__time"):
                v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[u]  # -> us
            else:
                v *= {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}[u]
            rec[m] = v
        out.append(rec)
    return out


def short(name):
    """'void ns::kernel<2, 2>(args)' -> 'kernel<2, 2>'."""
    name = name.replace("(anonymous namespace)::", "").replace("unnamed>::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0 and name[i - 1] not in " :":
            cut = i
            break
    name = name[:cut]
    if name.startswith("void "):
        name = name[5:]
    head, sep, tmpl = name.partition("<")
    return head.split("::")[-1] + sep + tmpl


def period_of(names, hint=None):
    if hint:
        return hint
    n = len(names)
    for p in range(8, n // 2 + 1):
        if names[n - p:] == names[n - 2 * p:n - p]:
            return p
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--period", type=int, default=None)
    a = ap.parse_args()
    rows = read_rows(a.csv)
    if not rows:
        sys.exit("no kernels in " + a.csv)
    names = [short(r["name"]) for r in rows]
    p = period_of(names, a.period)
    tok = rows[-p:]
    agg = OrderedDict()
    for r, nm in zip(tok, names[-p:]):
        t = agg.setdefault(nm, [0, 0.0, 0.0])
        t[0] += 1
        t[1] += r.get("gpu__time_duration.sum", 0.0)
        t[2] += r.get("dram__bytes_read.sum", 0.0)
    total = sum(v[1] for v in agg.values())
    print(f"kernels per token: {p}   sum of kernel times: {total:.1f} us")
    print(f"{'kernel':48s} {'n':>5s} {'us/token':>10s} {'us each':>9s} {'MB read':>9s} {'GB/s':>7s}")
    for nm, (n, us, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{nm[:48]:48s} {n:5d} {us:10.1f} {us / n:9.2f} {b / 1e6:9.2f} {b / 1e3 / us if us else 0:7.0f}")


if __name__ == "__main__":
    main()
