"""Summary of an Nsight Compute source-page CSV (h200_ncu_stalls.sh SOURCE=1): warp stall samples
per SASS instruction, added up over every profiled launch of the kernel.

  python3 bench/cuda/ncu_source_summary.py router_source.csv.gz            (stall reasons; the
      instructions holding >= 0.6 % of the samples; samples per 100 instructions)
  python3 bench/cuda/ncu_source_summary.py chain2_source.csv.gz --ranges 0,497,545,4104
      (the share of samples between those instruction indices: e.g. before and after ACQBULK,
      the programmatic wait)
  python3 bench/cuda/ncu_source_summary.py chain2_source.csv.gz --listing 1800,2100
      (every executed instruction of that range with its samples and main stall reasons)

Samples count where warps are, not time on the critical path: a kernel profiled alone passes its
programmatic wait at once, so its work before the wait shows in full here.
"""
import argparse
import csv
import gzip


def read(path):
    """The sections (one per profiled launch) of the first kernel named in the file."""
    opener = gzip.open if path.endswith(".gz") else open
    secs, cur = [], None
    with opener(path, "rt") as f:
        for r in csv.reader(f):
            if r and r[0] == "Kernel Name":
                cur = {"name": r[1], "rows": []}
                secs.append(cur)
            elif r and r[0] == "Address":
                cur["hdr"] = r
            elif cur is not None and r:
                cur["rows"].append(r)
    first = secs[0]
    return [s for s in secs if s["name"] == first["name"] and len(s["rows"]) == len(first["rows"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--ranges", help="instruction indices a,b,c,..: samples between them")
    ap.add_argument("--listing", help="lo,hi: each executed instruction of that range")
    ap.add_argument("--top", type=float, default=0.006, help="share of samples to list an instruction")
    a = ap.parse_args()
    secs = read(a.csv)
    hdr = secs[0]["hdr"]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    n = len(secs[0]["rows"])
    samples, executed = [0] * n, [0] * n
    reasons = [[0] * len(stalls) for _ in range(n)]
    for s in secs:
        for i, r in enumerate(s["rows"]):
            samples[i] += int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
            executed[i] += int(r[ix["Instructions Executed"]] or 0)
            for k, st in enumerate(stalls):
                reasons[i][k] += int(r[ix[st]] or 0)
    src = [r[ix["Source"]].strip() for r in secs[0]["rows"]]
    total = sum(samples) or 1
    print(f"{secs[0]['name'][:120]}\n{len(secs)} launches, {n} instructions, {total} samples")

    def top(lo, hi, m=5):
        t = sorted(((sum(reasons[i][k] for i in range(lo, hi)), stalls[k][6:]) for k in range(len(stalls))),
                   reverse=True)
        return " ".join(f"{name}={v}" for v, name in t[:m] if v)

    print("all:", top(0, n, 16))
    if a.ranges:
        cuts = [int(c) for c in a.ranges.split(",")]
        for lo, hi in zip(cuts, cuts[1:]):
            print(f"{lo:5d}-{hi:5d} {100 * sum(samples[lo:hi]) / total:5.1f} %  {top(lo, hi)}")
        return
    if a.listing:
        lo, hi = (int(c) for c in a.listing.split(","))
        for i in range(lo, min(hi, n)):
            if executed[i]:
                main_ = ",".join(f"{stalls[k][6:]}={v}" for k, v in enumerate(reasons[i]) if v >= max(1, samples[i] * 0.15))
                print(f"{i:5d} {samples[i]:6d} {executed[i] // len(secs):6d}  {src[i][:64]:64s} {main_}")
        return
    print("instructions with the most samples (index, samples, executed a launch, reasons):")
    for i in range(n):
        if samples[i] >= a.top * total:
            print(f"{i:5d} {samples[i]:6d} {executed[i] // len(secs):6d}  {src[i][:64]:64s} {top(i, i + 1, 4)}")
    print("per 100 instructions (samples, executed a launch, reasons):")
    for b in range(0, n, 100):
        s, e = sum(samples[b:b + 100]), sum(executed[b:b + 100]) // len(secs)
        if s or e:
            print(f"{b:5d} {s:6d} {e:7d}  {top(b, b + 100, 4)}")


if __name__ == "__main__":
    main()
