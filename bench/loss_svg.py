"""Loss curves of Tessera runs as an SVG (python's standard library only; bench/muon.sh).

Each run is LABEL=METRICS.jsonl: its training loss per step (thin, pale) and the mean of
the last WINDOW steps (bold), and its validation losses (dots) where the file has them.
Usage: loss_svg.py OUT.svg TITLE LABEL=FILE [LABEL=FILE ...] [--window N] [--ymax Y]
"""

import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
PALE = ["#aec7e8", "#ff9896", "#98df8a", "#c5b0d5"]


def read_run(path):
    train, val = {}, {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "step" not in d:
                continue
            if "loss" in d and d["loss"] is not None:
                train[d["step"]] = d["loss"]
            if "val_loss" in d:
                val[d["step"]] = d["val_loss"]
    return sorted(train.items()), sorted(val.items())


def running_mean(points, window):
    out, acc = [], []
    for s, v in points:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append((s, sum(acc) / len(acc)))
    return out


def nice_step(span, ticks=6):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def main():
    args = sys.argv[1:]
    window, ymax = 10, None
    if "--window" in args:
        i = args.index("--window")
        window = int(args[i + 1])
        del args[i:i + 2]
    if "--ymax" in args:
        i = args.index("--ymax")
        ymax = float(args[i + 1])
        del args[i:i + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    out, title, specs = args[0], args[1], args[2:]
    runs = []
    for spec in specs:
        label, path = spec.split("=", 1)
        train, val = read_run(path)
        runs.append((label, train, running_mean(train, window), val))

    W, H, L, R, T, B = 760, 440, 64, 20, 40, 50
    xmax = max(s for _, tr, _, _ in runs for s, _ in tr) + 1  # steps counted from 0
    smooth = [v for _, _, sm, _ in runs for _, v in sm]
    ylo = math.floor(min(smooth + [v for *_, va in runs for _, v in va]) * 4) / 4
    yhi = ymax if ymax is not None else math.ceil(max(v for _, tr, _, _ in runs for _, v in tr[5:]) * 2) / 2
    px = lambda s: L + (W - L - R) * s / xmax
    py = lambda v: T + (H - T - B) * (yhi - min(max(v, ylo), yhi)) / (yhi - ylo)

    e = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    dy = nice_step(yhi - ylo)
    y = math.ceil(ylo / dy) * dy
    while y <= yhi + 1e-9:
        e.append(f'<line x1="{L}" x2="{W - R}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        e.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += dy
    dx = nice_step(xmax)
    x = 0.0
    while x <= xmax + 1e-9:
        e.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        e.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:g}</text>')
        x += dx
    e.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#444"/>')
    e.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    e.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
             f'transform="rotate(-90 16 {(T + H - B) / 2})">loss (nats/token)</text>')
    poly = lambda pts: " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
    for i, (label, train, smooth_pts, val) in enumerate(runs):
        e.append(f'<polyline fill="none" stroke="{PALE[i % 4]}" stroke-width="0.8" points="{poly(train)}"/>')
    for i, (label, train, smooth_pts, val) in enumerate(runs):
        c = COLORS[i % 4]
        e.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{poly(smooth_pts)}"/>')
        for s, v in val:
            e.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3.5" fill="white" stroke="{c}" stroke-width="1.5"/>')
        ly = T + 18 + 18 * i
        e.append(f'<line x1="{W - R - 250}" x2="{W - R - 226}" y1="{ly - 4}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        e.append(f'<text x="{W - R - 220}" y="{ly}">{label}</text>')
    ly = T + 18 + 18 * len(runs)
    e.append(f'<text x="{W - R - 250}" y="{ly}" fill="#555">pale: each step; bold: mean of {window}; '
             f'dots: validation</text>')
    e.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(e) + "\n")


if __name__ == "__main__":
    main()
