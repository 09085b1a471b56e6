"""The probe's plumbing: running tessera (alone or under mpirun) with a time bound,
judging the result the way the reliability report does, and counting cases.

Python 3 standard library only. See README.md."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

CRASH_RE = re.compile(r"Segmentation|Aborted|core dumped|AddressSanitizer|runtime error|"
                      r"internal error|LeakSanitizer")


class Result:
    def __init__(self, rc, out, err, secs, timed_out, rank_rcs=None):
        self.rc, self.out, self.err, self.secs = rc, out, err, secs
        self.timed_out = timed_out
        self.rank_rcs = rank_rcs  # {rank: rc} under mpirun with the rc wrapper

    def first(self):
        lines = (self.err or self.out).strip().splitlines()
        return lines[0][:160] if lines else ""


def proc_tree_kill(p, sig=signal.SIGKILL):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def pids_with(needle):
    """Processes (pid list) whose command line contains needle: leftover ranks."""
    found = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in cmd and "probe.py" not in cmd:
            found.append(int(d))
    return found


def children_ranks(mpirun_pid):
    """{rank: pid} of the tessera processes under one mpirun."""
    ranks = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                ranks[int(e.split(b"=", 1)[1])] = int(d)
    return ranks


class Probe:
    def __init__(self, tessera, src, work, mode, asan=False, verbose=False):
        self.T = os.path.abspath(tessera)
        self.src = os.path.abspath(src)
        self.W = os.path.abspath(work)
        self.mode = mode
        self.asan = asan
        self.verbose = verbose
        self.results = []  # (category, id, ok, why, secs)
        self.rng = random.Random(20261201)
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        if asan:
            env.setdefault("ASAN_OPTIONS",
                           "detect_odr_violation=0:abort_on_error=1:fast_unwind_on_malloc=0")
            env.setdefault("LSAN_OPTIONS", f"suppressions={self.src}/tests/lsan.supp")
        self.env = env
        self.C = os.path.join(self.src, "configs", "tiny.cfg")
        os.makedirs(self.W, exist_ok=True)
        self.case_no = 0

    # ---- counting
    def record(self, cat, cid, ok, why, secs=0.0):
        if ok is None:
            tag = "SKIP"
        else:
            tag = "PASS" if ok else "FAIL"
        self.results.append((cat, cid, ok, why, secs))
        line = f"{tag} {cat} {cid} ({secs:.1f} s): {why}"
        print(line, flush=True)

    def quick(self):
        return self.mode == "quick"

    def path(self, *p):
        return os.path.join(self.W, *p)

    # ---- running
    def run(self, args, timeout=60, cwd=None, env=None, stdin=None, np=0, mpmd=None,
            wrap=True, shell=None, argv=None):
        """tessera ARGS as one process (np = 0) or under mpirun with np ranks (or an
        MPMD list of (np, args, extra mpirun options)), killed (the whole process group)
        after timeout s. Under mpirun each rank's exit status is kept (a wrapper writes
        it) unless wrap is False."""
        e = dict(self.env)
        if env:
            e.update(env)
        rcdir = None
        if argv is not None:
            cmd = list(argv)
        elif shell is not None:
            cmd = ["bash", "-c", shell]
        elif np == 0 and mpmd is None:
            cmd = [self.T] + list(args)
        else:
            self.case_no += 1
            rcdir = self.path("rc", str(self.case_no))
            shutil.rmtree(rcdir, ignore_errors=True)
            os.makedirs(rcdir)
            e["TS_RC_DIR"] = rcdir
            if wrap:  # each rank's own exit status (mpirun then says 0: see below)
                e["OMPI_MCA_orte_abort_on_non_zero_status"] = "0"
            wrapper = ["bash", "-c",
                       '"$@"; r=$?; echo "$r" > "$TS_RC_DIR/rc.${OMPI_COMM_WORLD_RANK:-x}"; exit "$r"',
                       "rank"] if wrap else []
            cmd = ["mpirun", "--oversubscribe"]
            apps = mpmd if mpmd is not None else [(np, args, [])]
            for i, (n, a, opts) in enumerate(apps):
                if i:
                    cmd.append(":")
                cmd += ["-np", str(n)] + list(opts) + wrapper + [self.T] + list(a)
        t0 = time.time()
        p = subprocess.Popen(cmd, cwd=cwd, env=e, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        timed_out = False
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc_tree_kill(p, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc_tree_kill(p)
                out, err = p.communicate()
        secs = time.time() - t0
        rank_rcs = None
        if rcdir and wrap:
            rank_rcs = {}
            for f in os.listdir(rcdir):
                r = f.split(".", 1)[1]
                if r.isdigit():
                    with open(os.path.join(rcdir, f)) as fh:
                        rank_rcs[int(r)] = int(fh.read().strip() or "-1")
        rc = p.returncode
        if rank_rcs and rc == 0 and any(rank_rcs.values()):
            # mpirun, told not to abort on a rank's non-zero exit, says 0: the ranks' own
            rc = next(v for _, v in sorted(rank_rcs.items()) if v)
        res = Result(rc, out.decode(errors="replace"), err.decode(errors="replace"),
                     secs, timed_out, rank_rcs)
        if self.verbose:
            print(f"    $ {' '.join(cmd)}\n    rc {res.rc} in {secs:.1f} s: {res.first()}")
        return res

    def run_shell(self, a, timeout=60):
        """bash A... (a -c script and its arguments)."""
        return self.run(None, timeout=timeout, argv=["bash"] + list(a))

    def Q(self, steps=2):
        """The report's $Q: a short quiet run (plus one thread and the probe's own data)."""
        return ["--set", f"train.steps={steps}", "--set", "data.eval_every=0",
                "--set", "log.progress=false", "--set", 'log.metrics=""',
                "--set", "train.threads=1",
                "--set", f'data.train="{self.path("data", "train.bin")}"',
                "--set", f'data.val="{self.path("data", "val.bin")}"']

    def train(self, *sets, steps=2, cfg=None):
        a = ["train", cfg or self.C] + self.Q(steps)
        for s in sets:
            a += ["--set", s]
        return a

    # ---- judging
    def judge_error(self, res, pattern=None, rc=None, np=1, bound=None):
        """The report's 'handled' for bad input: a non-zero exit that is not a hang or a
        signal, on every rank; 'tessera: error:' at least once and at most once per
        rank; PATTERN (a regex) found; no crash. Returns (ok, why)."""
        if res.timed_out:
            return False, f"no exit within the bound ({res.secs:.0f} s): a hang"
        if bound is not None and res.secs > bound:
            return False, f"took {res.secs:.1f} s, more than {bound} s"
        if res.rc == 0:
            return False, "exit 0, expected an error"
        if res.rc < 0 or res.rc >= 125 and res.rc != 134:
            return False, f"exit {res.rc}: a signal, not an error exit ({res.first()})"
        if CRASH_RE.search(res.err):
            m = CRASH_RE.search(res.err)
            line = [ln for ln in res.err.splitlines() if m.group(0) in ln][0]
            return False, f"crashed: {line[:200]}"
        if rc is not None and res.rc not in (rc if isinstance(rc, (tuple, list, set)) else (rc,)):
            return False, f"exit {res.rc}, expected {rc}: {res.first()}"
        if res.rank_rcs is not None:
            bad = [r for r in range(np) if res.rank_rcs.get(r, 0) == 0]
            if bad:
                return False, f"rank(s) {bad} exited 0 or not at all ({res.rank_rcs})"
        n = res.err.count("tessera: error:")
        if n < 1 or n > max(np, 1):
            return False, f"'tessera: error:' {n} times (expected 1..{max(np, 1)}): {res.first()}"
        if pattern and not re.search(pattern, res.err):
            return False, f"message does not match /{pattern}/: {res.first()}"
        return True, f"exit {res.rc}: {res.first()}"

    def judge_ok(self, res, pattern=None):
        if res.timed_out:
            return False, f"no exit within {res.secs:.0f} s: a hang"
        if res.rc != 0:
            return False, f"exit {res.rc}: {res.first()}"
        if CRASH_RE.search(res.err):
            return False, "sanitizer or crash report: " + CRASH_RE.search(res.err).group(0)
        if pattern and not re.search(pattern, res.out + res.err):
            return False, f"output does not match /{pattern}/: {(res.out + res.err)[:160]}"
        return True, "exit 0" + (f": {res.first()}" if res.first() else "")

    def err_case(self, cat, cid, args, pattern=None, rc=None, np=0, timeout=60, bound=None,
                 quick=True, **kw):
        if self.quick() and not quick:
            return None
        res = self.run(args, timeout=timeout, np=np, **kw)
        ok, why = self.judge_error(res, pattern, rc, max(np, 1), bound)
        self.record(cat, cid, ok, why, res.secs)
        return res

    def ok_case(self, cat, cid, args, pattern=None, np=0, timeout=60, quick=True, **kw):
        if self.quick() and not quick:
            return None
        res = self.run(args, timeout=timeout, np=np, **kw)
        ok, why = self.judge_ok(res, pattern)
        self.record(cat, cid, ok, why, res.secs)
        return res

    # ---- checkpoints
    def verify(self, d):
        return self.run(["ckpt", "verify", d], timeout=60)

    def ckpt_sound(self, d):
        """After a crash: `latest` (or, without one, the newest step) names a complete
        checkpoint that verifies, or nothing was committed (verify says 3); every
        committed step directory verifies. Returns (ok, why, resume_step or None)."""
        if not os.path.isdir(d):
            return True, "no checkpoint.dir yet", None
        steps = sorted(x for x in os.listdir(d) if re.fullmatch(r"step_\d{8}", x))
        for s in steps:
            v = self.verify(os.path.join(d, s))
            if v.rc != 0:
                return False, f"committed {s} does not verify (exit {v.rc}: {v.first()})", None
        v = self.verify(d)
        if os.path.exists(os.path.join(d, "latest")):
            if v.rc != 0:
                return False, f"latest does not verify (exit {v.rc}: {v.first()})", None
            with open(os.path.join(d, "latest")) as f:
                name = f.read().strip()
            return True, f"latest {name} verifies", int(name.split("_")[1])
        if steps:
            return True, f"no latest; newest {steps[-1]} verifies", int(steps[-1].split("_")[1])
        if v.rc != 3:
            return False, f"nothing committed but verify exits {v.rc}, not 3", None
        return True, "nothing committed yet (verify 3)", None

    def summary(self):
        cats = {}
        for cat, _, ok, _, secs in self.results:
            c = cats.setdefault(cat, [0, 0, 0, 0.0])
            c[0 if ok else (2 if ok is None else 1)] += 1
            c[3] += secs
        print("\nsummary (category: passed / failed / skipped, seconds in cases)")
        tot = [0, 0, 0, 0.0]
        for cat in sorted(cats):
            p, f, s, t = cats[cat]
            tot = [tot[0] + p, tot[1] + f, tot[2] + s, tot[3] + t]
            print(f"  {cat:12s} {p:4d} passed {f:4d} failed {s:3d} skipped  {t:7.1f} s")
        print(f"  {'total':12s} {tot[0]:4d} passed {tot[1]:4d} failed {tot[2]:3d} skipped  {tot[3]:7.1f} s")
        fails = [r for r in self.results if r[2] is False]
        if fails:
            print("\nfailures:")
            for cat, cid, _, why, _ in fails:
                print(f"  {cat} {cid}: {why}")
        return 1 if fails else 0


# ---- state.json with a recomputed state_crc32 (reader.c's ts_ckpt_state_crc: jansson's
# compact, key-sorted dump with 17-digit reals)
def _jreal(x):
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("jansson cannot write a non-finite real")
    s = "%.17g" % x
    if all(c in "0123456789-" for c in s):
        s += ".0"
    if "e" in s:
        m, ex = s.split("e")
        sign = "-" if ex.startswith("-") else ""
        ex = ex.lstrip("+-").lstrip("0") or "0"
        s = f"{m}e{sign}{ex}"
    return s


def jansson_compact(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _jreal(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(jansson_compact(x) for x in v) + "]"
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jansson_compact(v[k])
                          for k in sorted(v)) + "}"


def state_crc(state):
    import zlib
    s = {k: v for k, v in state.items() if k != "state_crc32"}
    return zlib.crc32(jansson_compact(s).encode()) & 0xffffffff


def edit_state(path, fn, fix_crc=True):
    with open(path) as f:
        s = json.load(f)
    fn(s)
    if fix_crc:
        s["state_crc32"] = state_crc(s)
    with open(path, "w") as f:
        json.dump(s, f, indent=1)


def losses(path):
    """{step: loss as written} of a metrics file (the text, for bit-for-bit checks)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            m = re.match(r'\{"step":(\d+),"loss":([^,]*),', line)
            if m:
                out[int(m.group(1))] = m.group(2)
    return out
