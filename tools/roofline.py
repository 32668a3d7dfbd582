#!/usr/bin/env python3
"""Roofline picture from mlakit_bench JSON: every benchmarked shape placed against the
measured memory and matrix ceilings that the bench binary recorded.
  python3 tools/roofline.py docs/data/bench-h200-2026-11-29-94a68d4.json docs/roofline-h200.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    runs = [b for b in json.load(open(src))["benchmarks"] if "TFLOPs" in b]
    if not runs:
        sys.exit("no decode benchmarks in " + src)
    bw = runs[0]["copy_TBps"]
    mma = runs[0]["mma_TFLOPs"]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ridge = mma / bw
    ax.plot([1, ridge, 2000], [bw * 1, mma, mma], "k-", lw=1.5,
            label=f"ceilings: copy {bw:.2f} TB/s, bf16 {mma:.0f} TFLOP/s")
    styles = {"fp8": ("tab:red", "o"), "bf16": ("tab:blue", "s")}
    seen = set()
    for b in runs:
        name = b["name"].split("/iterations")[0]
        kv = "fp8" if "/fp8/" in name else "bf16"
        intensity = b["TFLOPs"] / b["TBps"]  # FLOP per byte
        color, marker = styles[kv]
        label = f"{kv} KV" if kv not in seen else None
        seen.add(kv)
        ax.loglog(intensity, b["TFLOPs"], marker, color=color, ms=4, alpha=0.7, label=label)
    for name in ("decode/h16/q1/fp8/b128/kv8192/ps64", "decode/h16/q8/fp8/b128/kv8192/ps64",
                 "decode/h16/q8/bf16/b128/kv8192/ps64"):
        for b in runs:
            if b["name"].startswith(name + "/"):
                i = b["TFLOPs"] / b["TBps"]
                ax.annotate(name.replace("decode/", "").replace("/b128/kv8192/ps64", ""),
                            (i, b["TFLOPs"]), fontsize=7, xytext=(4, -10),
                            textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of KV + Q + O)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("mlakit decode on one H200 (shapes of docs/performance.md)")
    ax.set_xlim(1, 2000)
    ax.set_ylim(0.5, 1500)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
