"""The single-command hostile cases of the report's sections 1 and 3-7 and its
defect/question reproducers (D1-D13, Q1-Q10), each judged as the report's verdict
'handled' states it."""
import json
import os
import re
import shutil
import stat
import struct
import subprocess

from lib import edit_state, losses

CK_ERR = r"checkpoint\.load: "


def setup(P):
    """The corpus, and the good tiny.cfg checkpoint (steps 2 and 4) the damage cases copy."""
    os.makedirs(P.path("data"), exist_ok=True)
    txt = P.path("data", "corpus.txt")
    with open(txt, "wb") as out:
        for f in ("fortunes", "literature"):
            with open(f"/usr/share/games/fortunes/{f}", "rb") as fh:
                out.write(fh.read())
    with open(txt, "rb") as f:
        b = f.read()
    cut = len(b) * 9 // 10
    with open(P.path("data", "train.txt"), "wb") as f:
        f.write(b[:cut])
    with open(P.path("data", "val.txt"), "wb") as f:
        f.write(b[cut:])
    for n in ("train", "val"):
        r = P.run(["data", P.path("data", f"{n}.txt"), P.path("data", f"{n}.bin")])
        assert r.rc == 0, r.err
    base = P.path("base", "ck")
    shutil.rmtree(P.path("base"), ignore_errors=True)
    r = P.run(P.train(f'checkpoint.dir="{base}"', "checkpoint.every=2", steps=4))
    assert r.rc == 0, r.err
    return base


def copy_ck(P, base, name):
    d = P.path("cd", name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base, d)
    os.remove(os.path.join(d, ".lock"))
    return d


def st_header(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def resume_args(P, d, steps=6):
    return P.train(f'checkpoint.dir="{d}"', "checkpoint.load=latest", steps=steps)


# ---- section 1: checkpoints (damage, disk, dirs, resume)
def ckpt_cases(P, base):
    cat = "1-ckpt"
    s4 = "step_00000004"

    def damage(cid, fn, vrc, vpat=None, tpat=None, quick=True, train_ok=False):
        if P.quick() and not quick:
            return
        d = copy_ck(P, base, cid)
        fn(d)
        if vrc == 0:
            P.ok_case(cat, f"CK_{cid}_v", ["ckpt", "verify", d], "OK")
        else:
            P.err_case(cat, f"CK_{cid}_v", ["ckpt", "verify", d], vpat, rc=vrc, bound=20)
        if train_ok:
            P.ok_case(cat, f"CK_{cid}_t", resume_args(P, d))
        else:
            P.err_case(cat, f"CK_{cid}_t", resume_args(P, d), tpat or CK_ERR, rc=1, bound=20)

    def wlatest(data):
        def f(d):
            with open(os.path.join(d, "latest"), "wb") as fh:
                fh.write(data)
        return f

    damage("L1", wlatest(os.urandom(64)), 3, "latest")
    damage("L2", lambda d: (os.remove(f"{d}/latest"), os.mkdir(f"{d}/latest")), 3,
           "latest is not a regular file", "latest is not a regular file")
    # Q3: verify takes the newest step (handled in the report); train refuses at start-up
    damage("L3", lambda d: (os.remove(f"{d}/latest"), os.symlink("latest", f"{d}/latest")), 0,
           None, "latest is not a regular file")  # Q3: refused at start-up, not after training
    damage("L5", wlatest(b"../../base/ck/step_00000004\n"), 3, "does not name a checkpoint directory")
    damage("L6", wlatest(b"..\n"), 3, "does not name a checkpoint directory", quick=False)
    damage("L7", wlatest(b"step_00000004 \n"), 3, "does not exist", quick=False)
    damage("L8", wlatest(b"A" * 5000), 3, "latest", quick=False)
    damage("L9", wlatest(b"step_00000004"), 0, train_ok=True, quick=False)
    damage("L10", wlatest(b"state.json\n"), 3, "latest", quick=False)
    damage("L12", lambda d: shutil.copy(f"{d}/step_00000002/state.json", f"{d}/{s4}/state.json"), 3,
           "says step 2, but its directory is named for step 4")

    def rename4(newname):
        def f(d):
            os.rename(f"{d}/{s4}", f"{d}/{newname}")
            with open(f"{d}/latest", "w") as fh:
                fh.write(newname + "\n")
        return f

    damage("N4", rename4("step_4"), 0, train_ok=True, quick=False)
    damage("N3", rename4("step_00000009"), 3, "named for step 9", quick=False)

    def st(fn, fix=True):
        return lambda d: edit_state(f"{d}/{s4}/state.json", fn, fix)

    damage("S1", st(lambda s: s.update(step=5), fix=False), 3, "does not match its own checksum")
    damage("S2", st(lambda s: s.pop("step")), 3, '"step" is missing')

    def model(**kv):
        return st(lambda s: s["config"]["model"].update(kv))

    damage("S5", model(n_layer=2), (3, 5), None, "model.n_layer")
    damage("S6", model(n_layer=2**30), 3, "model.n_layer", "model.n_layer")  # D10
    damage("S7", model(n_embd=2**30, vocab_size=2**30), 3, "model", "model")  # D10
    damage("S8", model(n_head=3), 3, "n_head", "n_head")  # Q7
    damage("S9", st(lambda s: s["checksums"].pop("transformer.wte.weight")), 5, "no checksums")
    damage("S10", st(lambda s: s["files"].update({"../../../etc/passwd": {"bytes": 1}})), 3,
           "etc/passwd", quick=False)
    damage("S11", st(lambda s: s.update(version=2)), 3, "format version 2 is newer")
    def gb8(s):  # a consistent state of a run with global_batch 8
        s["data"].update(global_batch=8, sequences_consumed=4 * 8)
        s["config"]["train"]["global_batch"] = 8
    damage("S13", st(gb8), 0,
           tpat="train.global_batch = 8", quick=False)

    def bad_crc(s):
        c = s["checksums"]["transformer.wte.weight"]
        c[0] = (c[0] + 1) % 2**32
    damage("S14", st(bad_crc), 5, "fails its checksum")
    damage("S16", st(lambda s: s["files"]["model.safetensors"].update(bytes=2**52)), 4,
           "was truncated", quick=False)

    def fbytes(name, fn):
        def f(d):
            p = f"{d}/{s4}/{name}"
            with open(p, "rb") as fh:
                b = bytearray(fh.read())
            b = fn(b)
            with open(p, "wb") as fh:
                fh.write(b)
        return f

    def flip_wte(b):
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        lo = h["transformer.wte.weight"]["data_offsets"][0]
        b[8 + n + lo + 100] ^= 0x01
        return b

    damage("D1", fbytes("model.safetensors", lambda b: b[:-100]), 4, "truncated")
    damage("D3", fbytes("model.safetensors", flip_wte), 5, "fails its checksum")
    damage("D5", fbytes("optimizer.safetensors", lambda b: b[:-8] + bytes(8)), 5, "checksum", quick=False)
    damage("D7", lambda d: os.remove(f"{d}/{s4}/optimizer.safetensors"), 4, "is missing")
    damage("D9", lambda d: os.remove(f"{d}/{s4}/state.json"), 3, "has no state.json")
    damage("D10", fbytes("model.safetensors", lambda b: b + b"xxxxx"), 5, "trailing data")
    damage("D13", fbytes("model.safetensors", lambda b: b""), 4, "truncated", quick=False)
    damage("D14", fbytes("model.safetensors",
                         lambda b: b.replace(b'"dtype":"F32"', b'"dtype":"F16"', 1)), (4, 5), None,
           quick=False)
    damage("D11", lambda d: shutil.rmtree(f"{d}/step_00000002"), 0, train_ok=True, quick=False)

    # ---- checkpoint.dir unusable (D6): refused at start-up, before training
    os.makedirs(P.path("cdf"), exist_ok=True)
    afile = P.path("cdf", "afile")
    with open(afile, "w") as f:
        f.write("hi\n")
    for cid, d, pat, q in (("CF1", afile, "is not a directory", True),
                           ("CF2", afile + "/sub", "cannot create directory", False),
                           ("CF3", "/dev/null", "not a directory", True),
                           ("CF5", "/proc", "checkpoint.dir", False)):
        if P.quick() and not q:
            continue
        m = P.path("cdf", cid + ".jsonl")
        r = P.err_case(cat, cid, P.train(f'checkpoint.dir="{d}"', f'log.metrics="{m}"', steps=3),
                       pat, rc=1, bound=20)
        if r is not None and losses(m):
            P.record(cat, cid + "_early", False, "trained before refusing checkpoint.dir")

    # ---- resume with other keys
    rs = copy_ck(P, base, "RS")
    for cid, kv, pat in (("RS1", "train.global_batch=32", "train.global_batch = 16"),
                         ("RS2", "model.seq_len=32", "model.seq_len = 64"),
                         ("RS3", "model.n_layer=2", "model.n_layer = 4"),
                         ("RS4", "model.n_embd=64", "model.n_embd = 128"),
                         ("RS5", "model.vocab_size=300", "model.vocab_size = 256")):
        P.err_case(cat, cid, resume_args(P, rs) + ["--set", kv], pat, rc=1,
                   quick=cid in ("RS1", "RS3"))
    P.err_case(cat, "RS9", resume_args(P, rs, steps=3), "has already run 4 steps", rc=1)
    P.ok_case(cat, "RS6", resume_args(P, copy_ck(P, base, "RS6")) + ["--set", "parallel.micro_batch=8"],
              quick=False)
    d = copy_ck(P, base, "RS10")
    P.ok_case(cat, "RS10", P.train(f'checkpoint.dir="{d}"', f'checkpoint.load="{d}/step_00000002"', steps=3))

    # ---- any grid resumes any checkpoint (GR): the 1-rank continuation's losses to 1e-4
    ref = P.path("grid", "m_1.jsonl")
    os.makedirs(P.path("grid"), exist_ok=True)
    r1 = P.ok_case(cat, "GR_1", resume_args(P, copy_ck(P, base, "GR_1")) + ["--set", f'log.metrics="{ref}"'])
    grids = [("tp=2", ["parallel.tp=2"]), ("pp=2", ["parallel.pp=2"]),
             ("dp=2", ["parallel.dp=2", "parallel.zero=1"])]
    for name, sets in grids:
        if P.quick() and name != "pp=2":
            continue
        d = copy_ck(P, base, "GR_" + name)
        m = P.path("grid", f"m_{name}.jsonl")
        a = resume_args(P, d) + ["--set", f'log.metrics="{m}"']
        for s in sets:
            a += ["--set", s]
        r = P.run(a, np=2, timeout=90)
        ok, why = P.judge_ok(r)
        if ok and r1 is not None:
            A, B = losses(ref), losses(m)
            worst = max((abs(float(A[k]) - float(B[k])) / abs(float(A[k])) for k in A if k in B), default=1)
            ok = sorted(A) == sorted(B) and worst <= 1e-4
            why = f"steps {sorted(B)}, worst relative loss difference {worst:.2g} vs 1 rank"
        P.record(cat, "GR_" + name, ok, why, r.secs)
    P.err_case(cat, "GR_3", resume_args(P, rs) + ["--set", "parallel.dp=2"], "does not match the 3 ranks",
               np=3, quick=False)

    # ---- many files (X4) and a system error while verifying (D12)
    fg = P.path("x", "fg")
    shutil.rmtree(fg, ignore_errors=True)
    P.ok_case(cat, "X4", P.train(f'checkpoint.dir="{fg}"', "checkpoint.file_gb=1e-9"))
    P.ok_case(cat, "X4b", resume_args(P, fg, steps=4) + ["--set", "checkpoint.file_gb=1e-9"], quick=False)
    P.ok_case(cat, "X4c", ["sample", fg, "--prompt", "hi", "--tokens", "3"], quick=False)
    r = P.run([], shell=f'ulimit -n 40; exec "{P.T}" ckpt verify "{fg}"')
    ok, why = P.judge_error(r, "Too many open files", rc=1)
    P.record(cat, "X4e_D12", ok, why, r.secs)

    disk_cases(P, base, cat)


def disk_cases(P, base, cat):
    """A full disk (a 20 MB tmpfs) and a read-only file system: a precise message, and
    whatever was committed stays complete."""
    mnt = P.path("small")
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        P.record(cat, "DF*", None, "cannot mount a tmpfs here (not root?): disk cases skipped")
        return
    try:
        for cid, sets, q in (("DF1", ["train.steps=6", "checkpoint.every=1"], True),
                             ("DF4", ["train.steps=6", "checkpoint.every=1", "checkpoint.async=true"], True),
                             ("DF6", ["train.steps=3", "model.n_embd=256"], False)):
            if P.quick() and not q:
                continue
            d = os.path.join(mnt, cid)
            r = P.run(P.train(f'checkpoint.dir="{d}"', *sets[1:],
                              steps=int(sets[0].split("=")[1])), timeout=60)
            ok, why = P.judge_error(r, "No space left on device|cannot reserve", rc=1)
            if ok:
                ok2, why2, _ = P.ckpt_sound(d)
                ok, why = ok2, why + "; " + why2
            P.record(cat, cid, ok, why, r.secs)
            shutil.rmtree(d, ignore_errors=True)
        if not P.quick():
            d = os.path.join(mnt, "DF5")
            r = P.run(P.train(f'checkpoint.dir="{d}"', "parallel.dp=2", "parallel.zero=1",
                              "checkpoint.every=1", steps=6), np=2, timeout=90)
            ok, why = P.judge_error(r, "No space left on device|cannot reserve", rc=1, np=2)
            if ok:
                ok2, why2, _ = P.ckpt_sound(d)
                ok, why = ok2, why + "; " + why2
            P.record(cat, "DF5", ok, why, r.secs)
            shutil.rmtree(d, ignore_errors=True)
        # read-only: a checkpoint there still verifies, samples and resumes without saving
        # more than it may; a new save is refused at start-up (D6)
        ro = os.path.join(mnt, "ro")
        shutil.copytree(base, ro)
        os.remove(os.path.join(ro, ".lock"))
        subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
        P.err_case(cat, "RO1", resume_args(P, ro, steps=6), "Read-only file system", rc=1, bound=20)
        P.err_case(cat, "RO2", P.train(f'checkpoint.dir="{mnt}/newdir"', steps=3),
                   "Read-only file system", rc=1, bound=20)
        P.ok_case(cat, "RO3", ["ckpt", "verify", ro], "OK")
        P.ok_case(cat, "RO4", ["sample", ro, "--prompt", "hello", "--tokens", "5"], quick=False)
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


# ---- section 3: inputs that are not regular files (none may block: 10 s bound)
def nonreg_cases(P, base):
    cat = "3-nonreg"
    d = P.path("nr")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    fifo, fcsv, fbin, fjson = (f"{d}/fifo", f"{d}/fifo.csv", f"{d}/fifo.bin", f"{d}/fifo.json")
    for f in (fifo, fcsv, fbin, fjson):
        os.mkfifo(f)
    os.symlink("/dev/zero", f"{d}/link_zero")
    os.symlink("/dev/zero", f"{d}/zero.csv")
    os.mkdir(f"{d}/adir")
    os.mkdir(f"{d}/adir.csv")
    os.symlink(f"{d}/loopB", f"{d}/loopA")
    os.symlink(f"{d}/loopA", f"{d}/loopB")
    B = 10
    NRF = r"not a regular file|is a directory|Too many levels of symbolic links|not a directory"
    tr = [
        ("NR01", ['model.init="%s"' % fifo], NRF),
        ("NR02", ['data.train="%s"' % fbin], NRF),
        ("NR03", ['data.val="%s"' % fbin, "data.eval_every=1"], NRF),
        ("NR04", ['parallel.schedule="%s"' % fcsv], NRF),
        ("NR21", ['model.init="%s/adir"' % d], NRF),
        ("NR22", ['model.init="/dev/zero"'], NRF),
        ("NR23", ['model.init="%s/link_zero"' % d], NRF),
        ("NR24", ['model.init="%s/loopA"' % d], NRF),
        ("NR25", ['data.train="%s/adir"' % d], NRF),
        ("NR26", ['data.train="/dev/zero"'], NRF),
        ("NR27", ['data.train="/dev/full"'], NRF),
        ("NR28", ['data.train="%s/loopA"' % d], NRF),
        ("NR29", ['data.val="/dev/zero"', "data.eval_every=1"], NRF),
        ("NR31_D4", ['parallel.schedule="%s/zero.csv"' % d], NRF),
        ("NR32", ['parallel.schedule="%s/adir.csv"' % d], NRF),
        ("NR36", ['checkpoint.load="/dev/zero"'], NRF),
        ("NR37", ['checkpoint.load="%s/loopA"' % d], NRF),
        ("NR38", ['checkpoint.load="%s/adir"' % d], "holds neither a checkpoint"),
    ]
    quick_ids = {"NR01", "NR02", "NR04", "NR23", "NR26", "NR31_D4"}
    for cid, sets, pat in tr:
        P.err_case(cat, cid, P.train(*sets), pat, rc=1, timeout=30, bound=B, quick=cid in quick_ids)
    P.err_case(cat, "NR05_D3", ["train", fifo] + P.Q(), NRF, rc=1, timeout=30, bound=B)
    P.err_case(cat, "NR10_D3", ["train", fifo] + P.Q() + ["--set", "train.timeout_s=3"], NRF, rc=1,
               timeout=30, bound=B, quick=False)
    P.err_case(cat, "NR33", ["train", "/dev/zero"] + P.Q(), None, rc=1, timeout=30, bound=B)
    P.err_case(cat, "NR34", ["train", f"{d}/adir"] + P.Q(), "is a directory|not a regular file", rc=1, bound=B)
    P.err_case(cat, "NR35", ["train", f"{d}/loopA"] + P.Q(), "Too many levels", rc=1, bound=B, quick=False)
    P.err_case(cat, "NR06", P.train('checkpoint.load="%s"' % fifo), NRF, rc=1, bound=B, quick=False)
    P.err_case(cat, "NR11_Q9", ["data", fifo, f"{d}/out1.bin"], NRF, rc=1, timeout=30, bound=B)
    P.err_case(cat, "NR12", ["data", P.C, fbin], "is a pipe|not a regular file", rc=1, bound=B, quick=False)
    P.err_case(cat, "NR13_Q9", ["plan", P.C, "--cluster", fifo], NRF, rc=1, timeout=30, bound=B)
    P.err_case(cat, "NR14_Q9", ["plan", "--from-trace", fjson, "--svg", f"{d}/o.svg"], NRF, rc=1,
               timeout=30, bound=B, quick=False)
    P.err_case(cat, "NR15_Q9", ["plan", P.C, "--set", "parallel.pp=2", "--costs-from-trace", fjson], NRF,
               rc=1, timeout=30, bound=B, quick=False)
    P.err_case(cat, "NR16_Q9", ["plan", P.C, "--set", "parallel.pp=2", "--set", f'parallel.schedule="{fcsv}"',
                                "--cost", "model"], NRF, rc=1, timeout=30, bound=B, quick=False)
    P.err_case(cat, "NR31b_D4", ["plan", P.C, "--set", "parallel.pp=2", "--set",
                                 f'parallel.schedule="{d}/zero.csv"', "--cost", "model"], NRF, rc=1,
               timeout=30, bound=B)
    P.err_case(cat, "NR17", ["plan", P.C, "--set", "parallel.pp=2", "--svg", fifo, "--cost", "model"],
               "pipe|not a regular file", rc=1, bound=B, quick=False)
    r = P.run([], shell=f'"{P.T}" train <(sed "s/n_layer = 4/n_layer = 2/" "{P.C}") '
              + " ".join(f"'{x}'" for x in P.Q(1)))
    ok, why = P.judge_ok(r)
    P.record(cat, "NR19", ok, why + " (config through <(...))", r.secs)
    # a checkpoint holding FIFOs / a directory: train, verify, sample refuse at once
    for cid, what in (("c1", "latest"), ("c2", "step_00000004/state.json"),
                      ("c3", "step_00000004/model.safetensors"), ("c4", "step_00000004/optimizer.safetensors")):
        if P.quick() and cid not in ("c1", "c3"):
            continue
        c = copy_ck(P, base, "nrc_" + cid)
        os.remove(f"{c}/{what}")
        os.mkfifo(f"{c}/{what}")
        P.err_case(cat, f"NRC_{cid}_train", resume_args(P, c), NRF, rc=1, timeout=30, bound=B)
        P.err_case(cat, f"NRC_{cid}_verify", ["ckpt", "verify", c], NRF, rc=(3, 4), timeout=30, bound=B)
        P.err_case(cat, f"NRC_{cid}_info", ["ckpt", "info", c], NRF, rc=(1, 3, 4), timeout=30, bound=B,
                   quick=False)
        P.err_case(cat, f"NRC_{cid}_sample", ["sample", c, "--prompt", "hi", "--tokens", "3"], NRF,
                   timeout=30, bound=B, quick=False)
    c = copy_ck(P, base, "nrc_c7")
    os.remove(f"{c}/step_00000004/state.json")
    os.mkdir(f"{c}/step_00000004/state.json")
    P.err_case(cat, "NRC_c7_verify_Q4", ["ckpt", "verify", c], "not a regular file|is a directory", rc=3,
               bound=B)


# ---- section 4: numeric hostility and huge/negative integers
def numeric_cases(P):
    cat = "4-numeric"
    nf = "not applied|not finite|non-finite|overflows"
    for cid, sets, pat, q in (
            ("NU4", ["train.lr=1e309"], "not a finite number", True),
            ("NU9", ["train.eps=0"], "must be > 0", False),
            ("NU10", ["train.beta1=1.0"], r"in \[0, 1\)", True),
            ("NU11", ["train.beta2=1.0"], r"in \[0, 1\)", False),
            ("NU12", ["train.beta2=0.99999999999999999"], r"in \[0, 1\)", False),
            ("NU15", ["train.grad_clip=-1"], "must be >= 0", False),
            ("NU19", ["model.n_head=3"], "must divide by model.n_head", True),
            ("NU20", ["train.lr=-1"], "must be > 0", False),
            ("NU21", ["train.lr=inf"], "must be a number", False),
            ("NU23", ["train.grad_clip=1e309"], "not a finite number", False),
            ("NU24", ["train.weight_decay=1e309"], "not a finite number", False),
            ("NU2_D1", ["train.lr=1e39"], "overflows single precision", True),
            ("NU6", ["train.weight_decay=1e30"], nf, False)):
        P.err_case(cat, cid, P.train(*sets), pat, rc=1, quick=q)
    for cid, sets, q in (("NU5", ["train.lr=1e-300", "train.min_lr=0"], False),
                         ("NU7", ["train.eps=1e-300"], False), ("NU8", ["train.eps=1e30"], False),
                         ("NU13", ["train.beta1=0", "train.beta2=0"], False),
                         ("NU14", ["train.grad_clip=0"], True), ("NU16", ["train.grad_clip=1e-30"], False),
                         ("NU17", ["train.warmup=1000000"], False), ("NU18", ["model.seq_len=1"], True),
                         ("NU22", ["train.min_lr=-0.0"], False)):
        P.ok_case(cat, cid, P.train(*sets), quick=q)
    keys = ["model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.seq_len",
            "parallel.pp", "parallel.dp", "parallel.tp", "parallel.virtual_stages", "parallel.micro_batch",
            "parallel.zero", "parallel.bucket_mb", "train.global_batch", "train.steps", "train.seed",
            "train.warmup", "train.threads", "train.timeout_s", "data.eval_every", "data.val_windows",
            "checkpoint.every", "checkpoint.keep"]
    ok_vals = {("train.seed", "2147483647"), ("train.seed", "-1"), ("train.seed", "-2147483649"),
               ("train.warmup", "2147483647"), ("data.eval_every", "2147483647"),
               ("checkpoint.every", "2147483647"), ("checkpoint.keep", "2147483647")}
    qk = {"model.n_layer", "parallel.dp", "train.global_batch", "checkpoint.keep"}
    for i, k in enumerate(keys):
        for v in ("2147483647", "9223372036854775808", "-1", "-2147483649"):
            cid = f"INT_{k}_{v}"
            q = k in qk
            if k == "train.steps" and v == "2147483647":
                continue  # a valid run of 2^31 steps: the report stopped it with SIGTERM
            sets = [f"{k}={v}"]
            if k.startswith("checkpoint."):
                d = P.path("ints", f"ck{i}_{v}")
                shutil.rmtree(d, ignore_errors=True)
                sets.append(f'checkpoint.dir="{d}"')
            a = ["-c", f'ulimit -v 8000000; exec "$0" "$@"', P.T] + P.train(*sets, steps=1)
            if (k, v) in ok_vals:
                if P.quick() and not q:
                    continue
                r = P.run_shell(a)
                ok, why = P.judge_ok(r)
            else:
                if P.quick() and not q:
                    continue
                r = P.run_shell(a)
                ok, why = P.judge_error(r, re.escape(k) + "|global_batch", rc=1, bound=20)
            P.record(cat, cid, ok, why, r.secs)
    mem = "not enough memory"
    for cid, sets, q in (("BIG1", ["model.n_layer=65536"], True), ("BIG2", ["model.vocab_size=16777216"], False),
                         ("BIG3", ["model.seq_len=1048576"], False),
                         ("BIG4", ["model.n_embd=1048576", "model.n_head=1"], True),
                         ("BIG8", ["parallel.micro_batch=1048576", "train.global_batch=1048576"], False)):
        if P.quick() and not q:
            continue
        r = P.run_shell(["-c", 'ulimit -v 8000000; exec "$0" "$@"', P.T] + P.train(*sets, steps=1))
        ok, why = P.judge_error(r, mem, rc=1, bound=30)
        P.record(cat, cid, ok, why, r.secs)
    P.ok_case(cat, "BIG6", ["plan", P.C, "--set", "model.vocab_size=16777216", "--cost", "model"], quick=False)
    P.ok_case(cat, "BIG7", ["plan", P.C, "--set", "model.n_embd=1048576", "--set", "model.n_head=1",
                            "--cost", "model"], quick=False)


# ---- section 5: hostile files
def safetensors_cases(P, base):
    cat = "5-files"
    d = P.path("st")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    good = f"{base}/step_00000004/model.safetensors"
    b, n, h = st_header(good)
    data = b[8 + n:]

    def write(name, header_bytes, body=data):
        p = f"{d}/{name}.st"
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + body)
        return p

    def hj(fn):
        h2 = json.loads(json.dumps(h))
        fn(h2)
        return json.dumps(h2, separators=(",", ":")).encode()

    wte = "transformer.wte.weight"
    cases = {
        "good": (write("good", hj(lambda x: None)), None),
        "begin_gt_end": (write("begin_gt_end", hj(lambda x: x[wte].update(
            data_offsets=[x[wte]["data_offsets"][1], 0]))), "end before begin|data_offsets"),
        "bom": (write("bom", b"\xef\xbb\xbf" + hj(lambda x: None)[3:]), "does not start with"),
        "deep": (write("deep", b"[" * 100000 + b"]" * 100000), "does not start with|JSON"),
        "dtype_F16": (write("dtype_F16", hj(lambda x: x[wte].update(dtype="F16"))), "dtype F16"),
        "dtype_XYZ": (write("dtype_XYZ", hj(lambda x: x[wte].update(dtype="XYZ"))), "unknown dtype"),
        "dtype_int": (write("dtype_int", hj(lambda x: x[wte].update(dtype=7))), "dtype"),
        "dup_name": (write("dup_name", hj(lambda x: None)[:-1] + b',"' + wte.encode() + b'":'
                           + json.dumps(h[wte]).encode() + b"}"), "duplicate"),
        "float_offsets": (write("float_offsets", hj(lambda x: x[wte].update(data_offsets=[0.5, 8.5]))),
                          "data_offsets"),
        "hlen_max": (None, "header length"),
        "hlen_zero": (write("hlen_zero", b""), "header length 0|too short"),
        "hlen_plus1": (None, "JSON|header"),
        "huge_offsets": (write("huge_offsets", hj(lambda x: x[wte].update(
            data_offsets=[0, 2**64 - 1]))), "too big integer|data_offsets|out of range|exceed"),
        "json_array": (write("json_array", b"[1,2,3]"), "does not start with"),
        "meta_weird": (write("meta_weird", hj(lambda x: x.update(__metadata__={"a": 1}))), "not a string"),
        "missing": (write("missing", hj(lambda x: x.pop(wte))), "wte|hole in the data"),
        "nonutf8": (write("nonutf8", hj(lambda x: None)[:-1] + b',"\xff":1}'), "JSON|decode"),
        "overlap": (write("overlap", hj(lambda x: x["transformer.wpe.weight"].update(
            data_offsets=x[wte]["data_offsets"]))), "overlap|shape|bytes"),
        "shape_neg": (write("shape_neg", hj(lambda x: x[wte].update(shape=[-256, 128]))), "shape"),
        "shape_overflow": (write("shape_overflow", hj(lambda x: x[wte].update(shape=[2**62, 2**62]))),
                           "shape|overflow|bytes"),
        "shape_wrong": (write("shape_wrong", hj(lambda x: x[wte].update(shape=[128, 256]))), "shape"),
        "truncated": (write("truncated", hj(lambda x: None), data[:-4]), "truncated|bytes"),
        "trailing": (write("trailing", hj(lambda x: None), data + b"junk"), "trailing"),
        "longname": (write("longname", hj(lambda x: x.update({"x" * 100000: x[wte]}))), "x{20}|overlap|define"),
    }
    # hlen_max / hlen_plus1 have hand-made length fields
    p = f"{d}/hlen_max.st"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 2**64 - 1) + hj(lambda x: None) + data)
    cases["hlen_max"] = (p, cases["hlen_max"][1])
    p = f"{d}/hlen_plus1.st"
    hb = hj(lambda x: None)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(hb) + 1) + hb + data)
    cases["hlen_plus1"] = (p, cases["hlen_plus1"][1])
    # non-finite weights
    for name, val, pat in (("nan_weight", float("nan"), "holds NaN"), ("inf_weight", float("inf"), r"holds \+Inf")):
        lo = h[wte]["data_offsets"][0]
        body = bytearray(data)
        body[lo:lo + 4] = struct.pack("<f", val)
        cases[name] = (write(name, hj(lambda x: None), bytes(body)), pat)
    quick = {"good", "hlen_max", "dtype_F16", "dup_name", "nan_weight", "shape_overflow", "deep", "truncated"}
    for name, (path, pat) in cases.items():
        args = P.train(f'model.init="{path}"', steps=1)
        if pat is None:
            P.ok_case(cat, "STA_" + name, args, quick=name in quick)
        else:
            P.err_case(cat, "STA_" + name, args, pat, rc=1, bound=30, quick=name in quick)


def shard(tokens, magic=20240520, version=1, count=None, extra=b""):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *hdr) + struct.pack(f"<{len(tokens)}H", *tokens) + extra


def shard_cases(P):
    cat = "5-files"
    d = P.path("sh")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    toks = [(i * 7919) % 256 for i in range(20000)]
    big = [t for t in toks]
    big[12345] = 256
    mx = list(toks)
    mx[19999] = 65535
    files = {
        "good": (shard(toks), None),
        "tok_eq_vocab": (shard(big), "token 256 at position 12345"),
        "tok_max": (shard(mx), "token 65535 at position 19999"),
        "odd_bytes": (shard(toks, extra=b"\0"), "trailing data"),
        "count_lies": (shard(toks, count=30000), "truncated|bytes|count"),
        "count_neg": (shard(toks, count=-1), "negative token count"),
        "count_zero": (shard(toks, count=0), "trailing data"),
        "ver2": (shard(toks, version=2), "shard version 2"),
        "llama3": (shard(toks, magic=20240801), "Llama-3"),
        "short_header": (struct.pack("<10i", 20240520, 1, 5, 0, 0, 0, 0, 0, 0, 0), "truncated"),
        "tiny": (shard(toks[:10]), "fewer than one window"),
        "header_only": (shard([]), "0 tokens"),
    }
    quick = {"good", "tok_eq_vocab", "count_neg", "llama3", "short_header"}
    for name, (blob, pat) in files.items():
        p = f"{d}/{name}.bin"
        with open(p, "wb") as f:
            f.write(blob)
        a = P.train(f'data.train="{p}"', steps=1)
        if pat is None:
            P.ok_case(cat, "SH_" + name, a, quick=name in quick)
        else:
            P.err_case(cat, "SH_" + name, a, pat, rc=1, bound=30, quick=name in quick)
    P.err_case(cat, "SH_val_bad", P.train("data.eval_every=1", f'data.val="{d}/tok_eq_vocab.bin"', steps=1),
               "token 256", rc=1, quick=False)
    P.err_case(cat, "SH_list_mixed", P.train(f'data.train=["{d}/good.bin","{d}/llama3.bin"]', steps=1),
               "Llama-3", rc=1, quick=False)
    P.ok_case(cat, "SH_list_dup", P.train(f'data.train=["{d}/good.bin","{d}/good.bin"]', steps=1), quick=False)


def csv_cases(P):
    cat = "5-files"
    d = P.path("csv")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(f"{P.src}/tests/schedules/example_1f1b_pp2.csv") as f:
        good = f.read()
    rows = [r for r in good.splitlines() if r.strip() and not r.startswith("#")]
    r0 = rows[0].split(",")
    mk = {
        "good": (good, None),
        "no_final_nl": (good.rstrip("\n"), None),
        "trailing_blank": (good + "\n\n", None),
        "crlf": (good.replace("\n", "\r\n"), None),
        "cr_only_Q4": (good.replace("\n", "\r"), None),
        "repeat": ("\n".join([",".join([r0[0]] + r0)] + rows[1:]) + "\n", "appears twice"),
        "missing_mb": ("\n".join([",".join(c for c in r0 if c not in ("0F3", "0B3"))] + rows[1:]) + "\n",
                       "never runs"),
        "b_before_f": ("\n".join([",".join(sorted(r0, key=lambda c: "B" not in c))] + rows[1:]) + "\n",
                       "before its forward"),
        "bom": ("\ufeff" + good, "cell"),
        "inner_space": (good.replace("0F0", "0F 0", 1), "cell '0F 0'"),
        "neg": (good.replace("0F0", "0F-1", 1), "cell '0F-1'"),
        "nul": (good.replace("0F1", "0F\x001", 1), "cell|never|incomplete"),
        "huge_line": (",".join(["0F0"] * 2000000) + "\n" + rows[1] + "\n", "appears twice|line"),
        "many_blank": (good + "\n" * 1000000 + "0F0\n", "more lines than pipeline ranks"),
        "three_rows": (good + rows[1] + "\n", "more lines than pipeline ranks"),
    }
    quick = {"good", "cr_only_Q4", "repeat", "b_before_f", "huge_line"}
    for name, (text, pat) in mk.items():
        p = f"{d}/{name}.csv"
        with open(p, "w", newline="") as f:
            f.write(text)
        a = ["plan", P.C, "--set", "parallel.pp=2", "--set", "train.global_batch=16", "--set",
             "parallel.micro_batch=4", "--set", f'parallel.schedule="{p}"', "--cost", "model"]
        if pat is None:
            P.ok_case(cat, "CSV_" + name, a, quick=name in quick)
        else:
            P.err_case(cat, "CSV_" + name, a, pat, rc=1, bound=30, quick=name in quick)
    P.ok_case(cat, "CSVT_good", P.train("parallel.pp=2", f'parallel.schedule="{d}/good.csv"',
                                        "train.timeout_s=20"), np=2, timeout=90)


def cluster_cases(P):
    cat = "5-files"
    d = P.path("cl")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(f"{P.src}/configs/clusters/dgx-h100.cfg") as f:
        base = f.read()

    def sub(pattern, repl):
        t, n = re.subn(pattern, repl, base, count=1)
        assert n == 1, pattern
        return t

    g13 = f"{P.src}/configs/gpt3-1.3b.cfg"
    cases = {
        "bw_tiny_D5": (sub(r"(inter_node\s*=\s*\{\s*bandwidth_gbs\s*=\s*)[0-9.eE+-]+", r"\g<1>1e-300"),
                       "bandwidth_gbs"),
        "lat_huge_D5": (sub(r"(latency_us\s*=\s*)[0-9.eE+-]+", r"\g<1>1e300"), "latency_us"),
        "membw_tiny_D5": (sub(r"(memory_bandwidth_gbs\s*=\s*)[0-9.eE+-]+", r"\g<1>1e-300"),
                          "memory_bandwidth_gbs"),
        "gemm_one_D5": (sub(r"gemm_efficiency\s*=\s*\([^;]*\);", "gemm_efficiency = ( (256, 1e-300) );"),
                        "gemm_efficiency"),
        "bw_neg": (sub(r"(inter_node\s*=\s*\{\s*bandwidth_gbs\s*=\s*)[0-9.eE+-]+", r"\g<1>-50.0"),
                   "bandwidth_gbs = -50"),
        "dpn_frac": (sub(r"(devices_per_node\s*=\s*)[0-9]+", r"\g<1>2.5"), "devices_per_node"),
        "dpn_zero": (sub(r"(devices_per_node\s*=\s*)[0-9]+", r"\g<1>0"), "devices_per_node"),
        "mem_zero": (sub(r"(memory_gb\s*=\s*)[0-9.eE+-]+", r"\g<1>0.0"), "memory_gb"),
        "garbage": ("}{ not libconfig", "syntax error"),
        "gemm_empty": (sub(r"gemm_efficiency\s*=\s*\([^;]*\);", "gemm_efficiency = ( );"), "gemm_efficiency"),
        "gemm_gt1": (sub(r"gemm_efficiency\s*=\s*\([^;]*\);", "gemm_efficiency = ( (256, 1.5) );"),
                     "efficiency 1.5"),
        "minimal": ("cluster = { };", "missing"),
        "good": (base, None),
    }
    quick = {"bw_tiny_D5", "gemm_one_D5", "garbage", "good"}
    for name, (text, pat) in cases.items():
        p = f"{d}/{name}.cfg"
        with open(p, "w") as f:
            f.write(text)
        a = ["plan", g13, "--cluster", p, "--gpus", "64", "--search", "--top", "2"]
        if pat is None:
            P.ok_case(cat, "CL_" + name, a, quick=name in quick)
        else:
            P.err_case(cat, "CL_" + name, a, pat, rc=1, bound=30, quick=name in quick)
        if name.endswith("_D5"):
            a = ["plan", g13, "--cluster", p, "--set", "parallel.pp=2", "--set", "parallel.dp=4",
                 "--set", "parallel.tp=8"]
            P.err_case(cat, "CLP_" + name, a, pat, rc=1, bound=30, quick=False)


def trace_cases(P):
    cat = "5-files"
    d = P.path("tr")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)

    def ev(**kw):
        e = {"name": "F", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0, "args": {"mb": 0, "chunk": 0}}
        e.update(kw)
        return e
    cases = {
        "good": ({"traceEvents": [ev(), ev(tid=1, ts=5)]}, None),
        "tid_max": ({"traceEvents": [ev(tid=2147483647)]}, "tid"),
        "tid_float": ({"traceEvents": [ev(tid=1e30)]}, "tid"),
        "tid_frac": ({"traceEvents": [ev(tid=1.5)]}, "not a whole number"),
        "ts_huge": ({"traceEvents": [ev(ts=1e308)]}, '"ts"'),
        "ts_neg": ({"traceEvents": [ev(ts=-5)]}, '"ts"'),
        "dur_neg": ({"traceEvents": [ev(dur=-5)]}, '"dur"'),
        "mb_huge": ({"traceEvents": [ev(args={"mb": 2147483647, "chunk": 0})]}, "args.mb"),
        "events_obj": ({"traceEvents": {"a": 1}}, "traceEvents"),
        "bare_array": ([ev()], None),
        "not_json": ("{{{", "JSON"),
    }
    quick = {"good", "tid_max", "ts_huge", "not_json"}
    for name, (obj, pat) in cases.items():
        p = f"{d}/{name}.json"
        with open(p, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        a = ["plan", "--from-trace", p, "--svg", f"{d}/{name}.svg"]
        if pat is None:
            P.ok_case(cat, "TR_" + name, a, quick=name in quick)
        else:
            P.err_case(cat, "TR_" + name, a, pat, rc=1, bound=30, quick=name in quick)
    if not P.quick():
        p = f"{d}/many.json"
        with open(p, "w") as f:
            json.dump({"traceEvents": [ev(tid=i % 64, ts=i) for i in range(300000)]}, f)
        P.ok_case(cat, "TR_many", ["plan", "--from-trace", p, "--svg", f"{d}/many.svg"], timeout=60)


def sample_cases(P, base):
    cat = "5-files"
    for cid, extra, rc, pat, q in (
            ("SA4_Q10", ["--temperature", "4.9e-324", "--tokens", "3"], 0, None, True),
            ("SA5", ["--top-k", "-1"], 2, "--top-k", True),
            ("SA7", ["--seed", "-1"], 2, "--seed", False),
            ("SA8", ["--seed", "18446744073709551616"], 2, "--seed", False),
            ("SA9", ["--tokens", "0"], 2, "--tokens", True),
            ("SA10", ["--tokens", "1000001"], 2, "--tokens", False),
            ("SA11", ["--device", "cuda"], 2, "--device", False),
            ("SA13", ["--prompt", ""], 2, "--prompt is empty", False),
            ("SA14", ["--temperature", "nan"], 2, "--temperature", True),
            ("SA6", ["--top-k", "2147483647", "--tokens", "3"], 0, None, False),
            ("SA17", ["--prompt", "\udcff\udcfe\x01", "--tokens", "3"], 0, None, False)):
        a = ["sample", base, "--prompt", "hi"] + extra
        if rc == 0:
            P.ok_case(cat, cid, a, quick=q)
        else:
            P.err_case(cat, cid, a, pat, rc=rc, quick=q)
    r = P.run([], shell=f'"{P.T}" sample "{base}" --prompt hi --tokens 5 > /dev/full')
    ok, why = P.judge_error(r, "No space left on device", rc=1)
    P.record(cat, "SA16", ok, why, r.secs)
    P.err_case(cat, "SA19", ["sample", P.path("no", "such", "dir"), "--prompt", "hi"], "No such file", rc=1,
               quick=False)
    P.err_case(cat, "SA20", ["sample", base, base, "--prompt", "hi"], "one checkpoint directory", rc=2,
               quick=False)


def data_cases(P):
    cat = "5-files"
    d = P.path("data2")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    intxt = f"{d}/in.txt"
    shutil.copy(P.path("data", "val.txt"), intxt)
    os.symlink(intxt, f"{d}/link.txt")
    os.link(intxt, f"{d}/hard.txt")
    with open(f"{d}/sparse.txt", "wb") as f:
        f.truncate(3 * 2**30)
    with open(f"{d}/just_over.txt", "wb") as f:
        f.truncate(2**31)
    for cid, a, pat, q in (
            ("DA1", [f"{d}/sparse.txt", f"{d}/out1.bin"], "more than one shard can hold", True),
            ("DA2", [intxt, intxt], "is the same file", True),
            ("DA3", [intxt, f"{d}/link.txt"], "is the same file", False),
            ("DA9", [intxt, f"{d}/hard.txt"], "is the same file", False),
            ("DA7", [intxt, "/dev/full"], "not a regular file", True),
            ("DA8", [intxt, "/dev/null"], "not a regular file", False),
            ("DA10", [intxt, d + "/"], "names a directory", False),
            ("DA11", [f"{d}/just_over.txt", f"{d}/o.bin"], "more than one shard can hold", False)):
        P.err_case(cat, cid, ["data"] + a, pat, rc=1, bound=20, quick=q)
    P.ok_case(cat, "DA5", ["data", intxt, f"{d}/bin.bin"], "tokens")
    P.err_case(cat, "DA6", ["data", f"{d}/bin.bin", f"{d}/bin2.bin"], "already an llm.c token shard", rc=1,
               quick=False)


# ---- section 6: multi-rank disagreement
def ranks_cases(P):
    cat = "6-ranks"
    d = P.path("mr")
    shutil.rmtree(d, ignore_errors=True)
    for x in "ABC":
        os.makedirs(f"{d}/{x}")
    shutil.copy(P.path("data", "train.bin"), f"{d}/A/d.bin")
    shutil.copy(P.path("data", "val.bin"), f"{d}/C/d.bin")      # another corpus
    shutil.copy(P.path("data", "train.bin"), f"{d}/B/d.bin")    # same size, one byte differs
    with open(f"{d}/B/d.bin", "r+b") as f:
        f.seek(4000)
        c = f.read(1)
        f.seek(4000)
        f.write(bytes([c[0] ^ 1]))

    def two(sets_a, sets_b, opts_a=(), opts_b=(), args_a=None, args_b=None):
        return [(1, args_a or P.train(*sets_a), list(opts_a)), (1, args_b or P.train(*sets_b), list(opts_b))]

    P.err_case(cat, "MR1", None, "train.steps = 4 here but 2 on rank 0", rc=1, np=2,
               mpmd=two(["parallel.dp=2"], ["parallel.dp=2", "train.steps=4"]), timeout=60)
    P.err_case(cat, "MR2", None, "cannot open config file", rc=1, np=2, timeout=60,
               mpmd=two(["parallel.dp=2"], None, args_b=["train", f"{d}/nonexist.cfg"] + P.Q()
                        + ["--set", "parallel.dp=2"]))
    P.err_case(cat, "MR3", None, "train.lr = 0.002 here", rc=1, np=2, timeout=60, quick=False,
               mpmd=two(["parallel.pp=2"], ["parallel.pp=2", "train.lr=0.002"]))
    for cid, grid, other, q in (("MR4_D7", "parallel.dp=2", "B", True), ("MR8_D7", "parallel.dp=2", "C", False),
                                ("MR9_D7", "parallel.pp=2", "C", True), ("MR10_D7", "parallel.tp=2", "B", False)):
        s = [grid, 'data.train="d.bin"', 'data.val=""']
        P.err_case(cat, cid, None, "the ranks read different data at d.bin", rc=1, np=2, timeout=60, quick=q,
                   mpmd=two(s, s, ["-wdir", f"{d}/A"], ["-wdir", f"{d}/" + other]))
    s = ["parallel.dp=2", 'data.train="d.bin"', 'data.val=""']
    os.makedirs(f"{d}/E")
    os.makedirs(f"{d}/F")  # no d.bin there (MR7)
    with open(f"{d}/E/d.bin", "w") as f:
        f.write("0" * 2000)
    P.err_case(cat, "MR7", None, "No such file or directory", rc=1, np=2, timeout=60, quick=False,
               mpmd=two(s, s, ["-wdir", f"{d}/A"], ["-wdir", f"{d}/F"]))
    env_sets = ["train.timeout_s=20", "log.progress=true"]
    P.err_case(cat, "ENV2_D13", None, "TS_FAKE_NODES differs between ranks", rc=1, np=2, timeout=60, bound=15,
               mpmd=two(env_sets + ["parallel.tp=2"], env_sets + ["parallel.tp=2"],
                        ["-x", "TS_FAKE_NODES=1"]))
    P.err_case(cat, "ENV5", None, "TS_FAKE_NODES = 'abc'", rc=1, np=2, timeout=60, quick=False,
               mpmd=two(env_sets + ["parallel.dp=2"], env_sets + ["parallel.dp=2"], ["-x", "TS_FAKE_NODES=abc"]))
    r = P.run(None, np=2, timeout=60,
              mpmd=two(env_sets + ["parallel.pp=2"], env_sets + ["parallel.pp=2"], ["-x", "TS_PP_EXCHANGE=grouped"]))
    ok, why = P.judge_ok(r)
    P.record(cat, "ENV1", ok, why, r.secs)
    r = P.run(None, np=2, timeout=60,
              mpmd=two(env_sets + ["parallel.dp=2"], env_sets + ["parallel.dp=2"], ["-x", "TS_NO_BIND=1"]))
    ok, why = P.judge_ok(r)
    P.record(cat, "ENV4", ok, why, r.secs)
    ck = f"{d}/env6"
    if not P.quick():  # the watchdog (exit 14, its own message) names the stalled save
        r = P.run(None, np=2, timeout=90, wrap=False,
                  mpmd=two(env_sets + ["parallel.dp=2", f'checkpoint.dir="{ck}"'],
                           env_sets + ["parallel.dp=2", f'checkpoint.dir="{ck}"'], ["-x", "TS_TEST_SAVE_STALL_S=30"]))
        ok = r.rc == 14 and re.search(r"watchdog: rank 0 .*made no progress .*checkpoint", r.err) is not None
        P.record(cat, "ENV6", ok, f"exit {r.rc}: " + next((ln for ln in r.err.splitlines() if "watchdog" in ln),
                                                          r.first())[:160], r.secs)


# ---- section 7: careless users
def careless_cases(P, base):
    cat = "7-careless"
    ck1 = copy_ck(P, base, "X1")
    P.err_case(cat, "X1_D8", resume_args(P, ck1) + ["--set", f'log.metrics="{ck1}/step_00000004/model.safetensors"'],
               "inside the checkpoint", rc=1)
    v = P.verify(ck1)
    P.record(cat, "X1_D8_intact", v.rc == 0, f"verify exit {v.rc}", v.secs)
    ck2 = copy_ck(P, base, "X1b")
    P.err_case(cat, "X1b_Q8", resume_args(P, ck2) + ["--set", f'log.metrics="{ck2}/latest"'], "latest", rc=1)
    ck3 = P.path("x", "X2")
    shutil.rmtree(ck3, ignore_errors=True)
    r = P.run(P.train(f'checkpoint.dir="{ck3}"', "checkpoint.every=1", "checkpoint.keep=5", "model.n_layer=2",
                      steps=3))
    if r.rc != 0:
        P.record(cat, "X2_D9", False, "the first run failed: " + r.first())
    else:
        P.err_case(cat, "X2_D9", P.train(f'checkpoint.dir="{ck3}"', "checkpoint.every=1", steps=5),
                   "already holds checkpoints", rc=1)
        left = sorted(x for x in os.listdir(ck3) if x.startswith("step_"))
        P.record(cat, "X2_D9_kept", left == ["step_00000001", "step_00000002", "step_00000003"],
                 f"left {left}")
    # X3/X3b (D11): a checkpoint.dir per node (relative, a working directory per rank)
    for cid, stale in (("X3", False), ("X3b_D11", True)):
        w = P.path("x", cid)
        shutil.rmtree(w, ignore_errors=True)
        for n in ("n1", "n2"):
            os.makedirs(f"{w}/{n}")
        if stale:
            os.makedirs(f"{w}/n2/ck/.tmp-step_00000003")
            for f in ("model.safetensors", "optimizer.safetensors"):
                with open(f"{w}/n2/ck/.tmp-step_00000003/{f}", "wb") as fh:
                    fh.truncate(5_000_000)
        s = ["parallel.dp=2", 'checkpoint.dir="ck"']
        a = P.train(*s, steps=3)
        P.err_case(cat, cid, None, "is not the same directory on every rank", rc=1, np=2, timeout=60,
                   mpmd=[(1, a, ["-wdir", f"{w}/n1"]), (1, a, ["-wdir", f"{w}/n2"])])
        P.record(cat, cid + "_nothing_committed", not os.path.exists(f"{w}/n1/ck/latest"),
                 "n1/ck/latest " + ("exists" if os.path.exists(f"{w}/n1/ck/latest") else "absent"))


# ---- D1-D13 and Q1-Q10 as the report states them (the ones not above by name)
def repro_cases(P, base):
    cat = "repro"
    # D1 (NU3): lr 1e39 on a copy of the good checkpoint, keep 1
    ck = copy_ck(P, base, "D1")
    r = P.run(P.train(f'checkpoint.dir="{ck}"', "checkpoint.load=latest", "checkpoint.every=1",
                      "checkpoint.keep=1", "train.lr=1e39", "train.min_lr=0", steps=8))
    ok, why = P.judge_error(r, "overflows single precision", rc=1)
    v = P.verify(ck)
    ok = ok and v.rc == 0 and open(f"{ck}/latest").read().strip() == "step_00000004"
    P.record(cat, "D1_NU3", ok, why + f"; latest {open(ck + '/latest').read().strip()} verify {v.rc}", r.secs)
    # D1 (NU1): lr 1e30 on a fresh run, every=1: no non-finite state committed
    ck = P.path("cd", "D1b")
    shutil.rmtree(ck, ignore_errors=True)
    r = P.run(P.train(f'checkpoint.dir="{ck}"', "checkpoint.every=1", "train.lr=1e30", "train.min_lr=0",
                      "train.warmup=0", steps=5))
    ok, why = P.judge_error(r, "not applied|not finite", rc=1)
    # latest is the last step whose loss was finite (its weights may be ~1e30: then
    # sample says the logits are not finite, as the report's NU2s 'handled')
    v = P.verify(ck)
    s = P.run(["sample", ck, "--prompt", "hi", "--tokens", "3"])
    if v.rc != 0 or (s.rc != 0 and "not finite" not in s.err):
        ok, why = False, f"latest verify {v.rc}, sample {s.rc}: {s.first()}"
    P.record(cat, "D1_NU1", ok, why, r.secs)
    # D2, D3, D4, D5, D6, D7, D8, D9, D10, D11, D12, D13: the report's repro commands
    # are cases of their sections (TWO*, NR05_D3/NR01, NR31_D4, CL_*_D5, CF1, MR9_D7,
    # X1_D8, X2_D9, CK_S6/S7, X3b_D11, X4e_D12, ENV2_D13); here the ones stated apart.
    ck = P.path("cd", "D6")
    with open(ck, "w") as f:
        f.write("hi\n")
    m = P.path("cd", "D6.jsonl")
    r = P.run(P.train(f'checkpoint.dir="{ck}"', f'log.metrics="{m}"', "checkpoint.load=latest", steps=3))
    ok, why = P.judge_error(r, "is not a directory", rc=1)
    if losses(m):
        ok, why = False, "trained before refusing"
    P.record(cat, "D6_CF4", ok, why, r.secs)
    # D3: a stop signal during a blocked set-up ends it (a FIFO model.init: now refused
    # at once; the watchdog bound 3 s is not needed)
    r = P.run(P.train(f'model.init="{P.path("nr", "fifo")}"', "train.timeout_s=3"), timeout=20)
    ok, why = P.judge_error(r, "not a regular file", rc=1, bound=3)
    P.record(cat, "D3_NR08", ok, why, r.secs)
    # Q1: a half-deleted older step is finished at the next save
    ck = copy_ck(P, base, "Q1")
    os.rename(f"{ck}/step_00000002", f"{ck}/.del-step_00000002")
    os.remove(f"{ck}/.del-step_00000002/state.json")
    r = P.run(P.train(f'checkpoint.dir="{ck}"', "checkpoint.load=latest", "checkpoint.every=1",
                      "checkpoint.keep=1", "train.lr_decay_steps=4", steps=5))
    left = sorted(os.listdir(ck))
    ok = r.rc == 0 and left == [".lock", "latest", "step_00000005"]
    P.record(cat, "Q1", ok, f"exit {r.rc}, left {left}: {r.first()}", r.secs)
    # Q2 (DF3): disk full at latest says the step is committed: covered by
    # test_run_guards (a latest that cannot be replaced); here the sync state.json
    # message on a full disk names ENOSPC (DF2)
    mnt = P.path("q2mnt")
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9m", "tmpfs", mnt], capture_output=True).returncode:
        P.record(cat, "Q2_DF2", None, "no tmpfs")
    else:
        try:
            r = P.run(P.train(f'checkpoint.dir="{mnt}/ck"', "model.n_embd=256", steps=2))
            ok, why = P.judge_error(r, "No space left on device", rc=1)
            P.record(cat, "Q2_DF2", ok, why, r.secs)
        finally:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
    # Q5 (RS7): resuming on other data is said
    ck = copy_ck(P, base, "Q5")
    r = P.run(resume_args(P, ck) + ["--set", f'data.train="{P.path("data", "val.bin")}"',
                                    "--set", "log.progress=true"])
    ok = r.rc == 0 and re.search(r"holds other data|other files", r.err) is not None
    P.record(cat, "Q5_RS7", ok, f"exit {r.rc}; warning {'said' if ok else 'missing'}: {r.first()}", r.secs)
    # Q9: the single-process tools on a FIFO: covered by NR11/NR13-16 and NRC_*.
    # Q10: covered by SA4_Q10. Q3: CK_L3. Q4: CK_L1/L2, NRC_c7, CSV_cr_only. Q7: CK_S8.
    # Q8: X1b. Q6: signals T11, T19, W6.
