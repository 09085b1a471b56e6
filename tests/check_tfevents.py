#!/usr/bin/env python3
"""Read Tessera's TensorBoard event files back without TensorFlow or TensorBoard (Debian's
python3 alone) and check them against the run's metrics file (docs/CONTRACT.md
"TensorBoard"):

  check_tfevents.py METRICS.jsonl EVENTFILE... [--partial]

- every record's framing: the length, its masked CRC-32C, the data and its masked
  CRC-32C (a torn last record is accepted only with --partial: a disk that filled up);
- each file's first record is Event{wall_time, file_version = "brain.Event:2"};
- every other record is Event{wall_time, step, summary{value{tag, simple_value}...}},
  one per metrics line, in the lines' order (the files in the order of their first
  wall_time: a resumed run writes a new file), with the line's step (a line without
  "step": the start-up line takes the step its run starts at, any other the last step
  line's) and exactly the tags below, each value equal to the line's as float32:
    the key itself, or "val/X" for val_X and "hellaswag/X" for hellaswag_X;
    arrays: KEY/rankI for the per-rank lists, KEY/depthK (from 1) for mtp_loss and
    val_mtp_loss, KEY/datasetI for data_shares and data_epochs, KEY/I otherwise;
    moe_tokens[i][e] as moe/block<moe_layers[i]>/expert<e>; true/false 1/0; null NaN;
    strings are left out.
With --partial the events may stop early (a prefix of the lines). Prints a summary line.
"""
import json
import math
import struct
import sys


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value


def records(path, partial):
    data = open(path, "rb").read()
    at, out = 0, []
    while at < len(data):
        if len(data) - at < 12:
            if partial:
                break
            raise SystemExit(f"{path}: a torn record header at byte {at}")
        (n,) = struct.unpack_from("<Q", data, at)
        (hcrc,) = struct.unpack_from("<I", data, at + 8)
        if hcrc != masked(crc32c(data[at:at + 8])):
            raise SystemExit(f"{path}: record at byte {at}: the length's CRC does not match")
        if len(data) - at < 16 + n:
            if partial:
                break
            raise SystemExit(f"{path}: a torn record at byte {at}")
        body = data[at + 12:at + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, at + 12 + n)
        if dcrc != masked(crc32c(body)):
            raise SystemExit(f"{path}: record at byte {at}: the data's CRC does not match")
        out.append(body)
        at += 16 + n
    return out


def fields(buf):
    """Protocol buffer wire format: (field number, wire type, value) of each field."""
    at, out = 0, []

    def varint():
        nonlocal at
        shift = v = 0
        while True:
            b = buf[at]
            at += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while at < len(buf):
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            out.append((num, wt, varint()))
        elif wt == 1:
            out.append((num, wt, buf[at:at + 8]))
            at += 8
        elif wt == 2:
            n = varint()
            out.append((num, wt, buf[at:at + n]))
            at += n
        elif wt == 5:
            out.append((num, wt, buf[at:at + 4]))
            at += 4
        else:
            raise SystemExit(f"unexpected wire type {wt}")
    return out


def event(body):
    ev = {"step": 0, "values": None}
    for num, wt, v in fields(body):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wt == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            values = []
            for vn, vwt, vv in fields(v):
                if vn != 1 or vwt != 2:
                    raise SystemExit(f"Summary: unexpected field {vn}")
                tag, val = None, None
                for fn, fwt, fv in fields(vv):
                    if fn == 1 and fwt == 2:
                        tag = fv.decode()
                    elif fn == 2 and fwt == 5:
                        val = struct.unpack("<f", fv)[0]
                    else:
                        raise SystemExit(f"Summary.Value: unexpected field {fn}")
                if tag is None or val is None:
                    raise SystemExit("Summary.Value without a tag or a simple_value")
                values.append((tag, val))
            ev["values"] = values
        else:
            raise SystemExit(f"Event: unexpected field {num} (wire type {wt})")
    return ev


ARRAY_LABELS = {k: ("rank", 0) for k in (
    "blas_gflops", "gemm_gflops", "peak_rss_mb", "activation_mb", "optimizer_mb",
    "step_peak_rss_mb", "state_mb", "zero_buffers_mb", "estimate_mb")}
ARRAY_LABELS.update({"mtp_loss": ("depth", 1), "val_mtp_loss": ("depth", 1),
                     "data_shares": ("dataset", 0), "data_epochs": ("dataset", 0)})


def tag_of(key):
    for prefix, group in (("val_", "val/"), ("hellaswag_", "hellaswag/")):
        if key.startswith(prefix) and len(key) > len(prefix):
            return group + key[len(prefix):]
    return key


def expected(line):
    out = []

    def walk(tag, v, label="", base=0):
        if isinstance(v, bool):
            out.append((tag, 1.0 if v else 0.0))
        elif isinstance(v, (int, float)):
            out.append((tag, float(v)))
        elif v is None:
            out.append((tag, math.nan))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(f"{tag}/{label}{i + base}", x)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{tag}/{k}", x)

    for key, v in line.items():
        if key in ("step", "moe_layers"):
            continue
        if key == "moe_tokens":
            for i, row in enumerate(v):
                for e, x in enumerate(row):
                    walk(f"moe/block{line['moe_layers'][i]}/expert{e}", x)
            continue
        label, base = ARRAY_LABELS.get(key, ("", 0))
        walk(tag_of(key), v, label, base)
    return out


def f32(x):
    if math.isfinite(x) and abs(x) > 3.4028234663852886e38:  # C's (float) cast: infinity
        return math.copysign(math.inf, x)
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    args = [a for a in sys.argv[1:] if a != "--partial"]
    partial = "--partial" in sys.argv[1:]
    lines = [json.loads(s) for s in open(args[0]) if s.strip()]
    files = []
    for path in args[1:]:
        evs = [event(b) for b in records(path, partial)]
        if not evs or evs[0].get("file_version") != "brain.Event:2" or evs[0]["values"] is not None:
            raise SystemExit(f"{path}: the first record is not Event{{file_version=\"brain.Event:2\"}}")
        if "wall_time" not in evs[0]:
            raise SystemExit(f"{path}: the first record has no wall_time")
        files.append(evs)
    files.sort(key=lambda evs: evs[0]["wall_time"])
    events = [e for evs in files for e in evs[1:]]
    if not events:
        raise SystemExit("no summary events after the file_version record")
    for e in events:
        if e["values"] is None or "wall_time" not in e:
            raise SystemExit("an event after the first is not {wall_time, step, summary}")
    if len(events) > len(lines) or (not partial and len(events) != len(lines)):
        raise SystemExit(f"{len(events)} summary events for {len(lines)} metrics lines")
    # A line without "step": the start-up line (blas_gflops) takes the step its run
    # starts at, the next step line's; any other the last step line's before it.
    steps, last = [], None
    for i, line in enumerate(lines):
        if "step" in line:
            last = line["step"]
        elif "blas_gflops" in line:
            nxt = next((x["step"] for x in lines[i + 1:] if "step" in x), None)
            last = nxt if nxt is not None else (last + 1 if last is not None else 0)
        steps.append(last if last is not None else 0)
    tags = set()
    for i, (e, line) in enumerate(zip(events, lines)):
        step = steps[i]
        if e["step"] != step:
            raise SystemExit(f"line {i + 1}: event step {e['step']}, line step {step}")
        want = expected(line)
        got = e["values"]
        if [t for t, _ in got] != [t for t, _ in want]:
            raise SystemExit(f"line {i + 1}: tags {[t for t, _ in got]} != {[t for t, _ in want]}")
        for (tag, g), (_, w) in zip(got, want):
            same = (math.isnan(g) and math.isnan(w)) or g == f32(w)
            if not same:
                raise SystemExit(f"line {i + 1}: {tag} = {g!r} in the events, {w!r} (float32 "
                                 f"{f32(w)!r}) in the metrics")
            tags.add(tag)
    print(f"check_tfevents: {len(files)} file(s), {len(events)} events for {len(lines)} lines, "
          f"{len(tags)} tags, every CRC and value checked")


if __name__ == "__main__":
    main()
