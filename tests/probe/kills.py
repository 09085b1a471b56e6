"""The report's kill tests (1b two runs on one checkpoint.dir, 1c SIGKILL at random
moments, 1d SIGKILL at an exact system call through strace) and its section 2 (signals,
preemption, watchdog)."""
import os
import re
import shutil
import signal
import subprocess
import time

from lib import CRASH_RE, children_ranks, losses, pids_with


def kill_model(P, d, metrics, steps=8, extra=()):
    """The report's kill-test run: n_layer 4, n_embd 256, seq 32, every step saved."""
    a = ["train", P.C, "--set", "model.n_layer=4", "--set", "model.n_embd=256", "--set", "model.seq_len=32",
         "--set", "train.global_batch=8", "--set", "train.threads=1", "--set", f"train.steps={steps}",
         "--set", f'data.train="{P.path("data", "train.bin")}"', "--set", 'data.val=""',
         "--set", "data.eval_every=0", "--set", "log.progress=false", "--set", f'log.metrics="{metrics}"',
         "--set", f'checkpoint.dir="{d}"', "--set", "checkpoint.every=1", "--set", "checkpoint.keep=2",
         "--set", "train.lr_decay_steps=8"]
    for s in extra:
        a += ["--set", s]
    return a


def launch(P, args, np=0, out=None, env=None, prefix=()):
    e = dict(P.env)
    if env:
        e.update(env)
    cmd = list(prefix) + ([P.T] + args if np == 0 else
                          ["mpirun", "--oversubscribe", "-np", str(np), P.T] + args)
    fo = open(out + ".out", "wb")
    fe = open(out + ".err", "wb")
    p = subprocess.Popen(cmd, env=e, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True)
    p._files = (fo, fe)
    p._t0 = time.time()
    return p


def finish(p, timeout):
    """Wait for p (killing its group after timeout); (rc, seconds, timed_out)."""
    timed_out = False
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    for f in p._files:
        f.close()
    return p.returncode, time.time() - p._t0, timed_out


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def rank_pids(p, np, wait=10.0):
    if np == 0:
        return {0: p.pid}
    t = time.time()
    while time.time() - t < wait:
        r = children_ranks(p.pid)
        if len(r) == np:
            return r
        if p.poll() is not None:
            return r
        time.sleep(0.01)
    return children_ranks(p.pid)


def no_leftovers(needle, wait=3.0):
    t = time.time()
    while time.time() - t < wait:
        if not pids_with(needle):
            return True, ""
        time.sleep(0.1)
    left = pids_with(needle)
    for pid in left:  # ours: a case's own ranks
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return False, f"leftover processes {left}"


def resume_bitwise(P, args, np, ref, m, d):
    """Resume with checkpoint.load = latest; the losses of every step it runs equal the
    uninterrupted run's, as written. (ok, why)."""
    if os.path.exists(m):
        os.remove(m)
    r = P.run(args + ["--set", "checkpoint.load=latest", "--set", f'log.metrics="{m}"'], np=np, timeout=120,
              wrap=False)
    if r.rc != 0:
        return False, f"resume exit {r.rc}: {r.first()}"
    got = losses(m)
    bad = [k for k in got if ref.get(k) != got[k]]
    if not got:
        latest = read(os.path.join(d, "latest")).strip()
        if latest == "step_%08d" % (max(ref) + 1):
            return True, "latest is the final step: nothing left to resume (exit 0)"
        return False, f"the resume ran no step (latest {latest!r})"
    if bad:
        return False, f"resumed losses differ at steps {bad} ({got[bad[0]]} vs {ref.get(bad[0])})"
    return True, f"resumed steps {min(got)}-{max(got)} bit-identical"


# ---- 1c: SIGKILL at random moments
KILL_MODES = [  # name, ranks, extra sets, kill which ranks, trials in full mode
    ("1r-sync", 0, [], "all", 24),
    ("1r-async", 0, ["checkpoint.async=true"], "all", 24),
    ("dp2-both-sync", 2, ["parallel.dp=2"], "all", 24),
    ("dp2-both-async", 2, ["parallel.dp=2", "checkpoint.async=true"], "all", 16),
    ("dp2-r1-sync", 2, ["parallel.dp=2"], "r1", 16),
    ("pp2-both-async", 2, ["parallel.pp=2", "checkpoint.async=true"], "all", 16),
]


def random_kills(P):
    cat = "1c-killrand"
    for name, np, extra, which, full_n in KILL_MODES:
        n = full_n if not P.quick() else 2
        base = P.path("kill", name)
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        ref_m = f"{base}/ref.jsonl"
        t0 = time.time()
        r = P.run(kill_model(P, f"{base}/ref_ck", ref_m, extra=extra), np=np, timeout=120, wrap=False)
        dur = time.time() - t0
        if r.rc != 0:
            P.record(cat, f"{name}-ref", False, f"the uninterrupted run failed: {r.first()}", r.secs)
            continue
        ref = losses(ref_m)
        for t in range(n):
            d = f"{base}/t{t}/ck"
            os.makedirs(os.path.dirname(d))
            args = kill_model(P, d, f"{base}/t{t}/m0.jsonl", extra=extra)
            p = launch(P, args, np, out=f"{base}/t{t}/run")
            on_save = P.rng.random() < 2 / 3
            inflight = False
            if on_save:
                while p.poll() is None and not inflight:
                    try:
                        inflight = any(x.startswith(".tmp-step_") for x in os.listdir(d))
                    except FileNotFoundError:
                        pass
                    if not inflight:
                        time.sleep(0.001)
                time.sleep(P.rng.uniform(0, 0.09))
            else:
                time.sleep(P.rng.uniform(0.2, max(0.3, dur)))
            pids = rank_pids(p, np, wait=2)
            if not inflight and os.path.isdir(d):
                inflight = any(x.startswith(".tmp-step_") for x in os.listdir(d))
            targets = [pids[k] for k in sorted(pids) if which == "all" or k == 1]
            t_kill = time.time()
            for pid in targets:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            rc, _, to = finish(p, 30)
            end_s = time.time() - t_kill
            why = [f"kill {'on a save' if on_save else 'at random'}{' (save in flight)' if inflight else ''}",
                   f"job ended {end_s:.1f} s after"]
            ok = not to
            if to:
                why.append("HANG: no exit in 30 s")
            if which == "r1" and end_s > 5:
                ok = False
                why.append("more than 5 s after a rank's death")
            lo, lw = no_leftovers(d)
            if not lo:
                ok = False
                why.append(lw)
            s_ok, s_why, _ = P.ckpt_sound(d)
            why.append(s_why)
            ok = ok and s_ok
            if s_ok:
                b_ok, b_why = resume_bitwise(P, args, np, ref, f"{base}/t{t}/m1.jsonl", d)
                ok = ok and b_ok
                why.append(b_why)
            P.record(cat, f"{name}-t{t}", ok, "; ".join(why), time.time() - t_kill)


# ---- 1b: two runs on one checkpoint.dir
def two_runs(P):
    cat = "1b-tworuns"
    reps = 11 if not P.quick() else 2
    for rep in range(reps):
        w = P.path("two", f"rep{rep}")
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        d = f"{w}/ck"
        ps = []
        for seed in (1, 2):
            a = kill_model(P, d, f"{w}/m{seed}.jsonl", steps=10, extra=[f"train.seed={seed}"])
            ps.append(launch(P, a, 0, out=f"{w}/run{seed}"))
        res = [finish(p, 90) for p in ps]
        errs = [read(f"{w}/run{s}.err") for s in (1, 2)]
        rcs = [r[0] for r in res]
        why = [f"rc {rcs}"]
        ok = not any(r[2] for r in res) and sorted(rcs) == [0, 1]
        if ok:
            lose = rcs.index(1)
            e = errs[lose]
            n = e.count("tessera: error:")
            m = re.search(r"is in use by another run|already holds checkpoints", e)
            if n != 1 or not m or CRASH_RE.search(e):
                ok = False
                why.append(f"the refused run said {n} errors: {e.strip().splitlines()[:1]}")
            else:
                why.append("loser: " + m.group(0))
            s_ok, s_why, step = P.ckpt_sound(d)
            ok = ok and s_ok and step == 10
            why.append(s_why)
            import json
            try:
                with open(f"{d}/step_00000010/state.json") as f:
                    seed = json.load(f)["config"]["train"]["seed"]
                if seed != rcs.index(0) + 1:
                    ok = False
                    why.append(f"the checkpoint holds seed {seed}, not the winner's")
            except (OSError, KeyError, ValueError) as ex:
                ok = False
                why.append(f"state.json: {ex}")
        else:
            why.append(" | ".join(x.strip().splitlines()[0] if x.strip() else "" for x in errs))
        P.record(cat, f"TWO{rep}", ok, "; ".join(why), max(r[1] for r in res))


# ---- 1d: SIGKILL at an exact system call (strace -e inject=SYSCALL:signal=KILL:when=N)
def strace(P, *opts):
    """strace OPTS as a command prefix. Under --asan without LeakSanitizer, which cannot
    run in a traced process (it stops with "LeakSanitizer has encountered a fatal
    error"); AddressSanitizer itself stays on."""
    pre = []
    if P.asan:
        pre = ["env", "ASAN_OPTIONS=" + P.env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"]
    return pre + ["strace"] + list(opts)


def count_syscalls(P, args, calls, out):
    r = P.run(None, timeout=120, argv=strace(P, "-f", "-c", "-o", out, "-e", "trace=" + ",".join(calls))
              + [P.T] + args)
    counts = {}
    for line in read(out).splitlines():
        f = line.split()
        if f and f[-1] in calls and f[3].isdigit():
            counts[f[-1]] = int(f[3])
    return r, counts


def injected(P):
    cat = "1d-inject"
    if shutil.which("strace") is None:
        P.record(cat, "strace", None, "strace is not installed (apt-get install strace)")
        return
    base = P.path("inject")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    ref_m = f"{base}/ref.jsonl"
    ext = ["checkpoint.keep=2"]
    a = kill_model(P, f"{base}/ref_ck", ref_m, steps=4, extra=ext)
    r, counts = count_syscalls(P, a, ["rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir",
                                      "fsync", "fallocate", "pwrite64"], f"{base}/count.txt")
    if r.rc != 0:
        P.record(cat, "count", False, f"the counted run failed: {r.first()}")
        return
    ref = losses(ref_m)
    plan = []
    for sc, n in sorted(counts.items()):
        if sc in ("rename", "renameat", "unlink", "unlinkat", "rmdir", "fallocate"):
            ns = list(range(1, n + 1))
        elif sc == "fsync":
            ns = list(range(1, n + 1, 3))
        elif sc == "pwrite64":
            ns = sorted({1, max(1, n // 20), n // 5, n // 2, (3 * n) // 4, n - 1, n} - {0})
        else:
            ns = list(range(1, n + 1))
        if P.quick():
            ns = sorted({ns[0], ns[len(ns) // 2], ns[-1]})
        plan += [(sc, k) for k in ns]
    print(f"    syscalls of a 4-step run: {counts}; {len(plan)} injections", flush=True)

    def one(cid, sc, k, args, ck, m, pre=None):
        if pre:
            pre()
        p = launch(P, args, 0, out=f"{m}.run",
                   prefix=strace(P, "-f", "-qq", "-o", "/dev/null", "-e", f"inject={sc}:signal=KILL:when={k}"))
        rc, secs, to = finish(p, 120)
        fired = rc != 0
        why = [f"{sc} #{k}: {'killed' if fired else 'not reached, run completed'} (rc {rc})"]
        ok = not to
        lo, lw = no_leftovers(ck)
        if not lo:
            ok = False
            why.append(lw)
        s_ok, s_why, _ = P.ckpt_sound(ck)
        why.append(s_why)
        ok = ok and s_ok
        if s_ok:
            b_ok, b_why = resume_bitwise(P, args, 0, ref, m + ".resume.jsonl", ck)
            ok = ok and b_ok
            why.append(b_why)
        P.record(cat, cid, ok, "; ".join(why), secs)

    for i, (sc, k) in enumerate(plan):
        ck = f"{base}/{sc}_{k}/ck"
        os.makedirs(os.path.dirname(ck))
        m = f"{base}/{sc}_{k}/m0"
        one(f"{sc}@{k}", sc, k, kill_model(P, ck, m + ".jsonl", steps=4, extra=ext), ck, m)

    # the re-save of an existing step after a rollback: steps 1-4 kept, resumed from
    # step 2, steps 3 and 4 saved again (swapped in with RENAME_EXCHANGE)
    full = kill_model(P, f"{base}/resave_src", f"{base}/resave_src.jsonl", steps=4, extra=["checkpoint.keep=4"])
    r = P.run(full, timeout=120)
    if r.rc != 0:
        P.record(cat, "resave-src", False, r.first())
        return
    rplan = [("renameat2", 1), ("renameat2", 2)] + [("unlink", k) for k in range(1, 9)]
    if P.quick():
        rplan = [("renameat2", 1), ("unlink", 3)]
    for sc, k in rplan:
        w = f"{base}/resave_{sc}_{k}"
        ck = f"{w}/ck"
        os.makedirs(w)
        shutil.copytree(f"{base}/resave_src", ck)
        a = kill_model(P, ck, f"{w}/m0.jsonl", steps=4, extra=["checkpoint.keep=4"])
        a += ["--set", f'checkpoint.load="{ck}/step_00000002"']
        a_resume = kill_model(P, ck, f"{w}/m0.jsonl", steps=4, extra=["checkpoint.keep=4"])
        p = launch(P, a, 0, out=f"{w}/run",
                   prefix=strace(P, "-f", "-qq", "-o", "/dev/null", "-e", f"inject={sc}:signal=KILL:when={k}"))
        rc, secs, to = finish(p, 120)
        why = [f"re-save, {sc} #{k}: rc {rc}"]
        ok = not to
        s_ok, s_why, _ = P.ckpt_sound(ck)
        why.append(s_why)
        ok = ok and s_ok
        if s_ok:
            b_ok, b_why = resume_bitwise(P, a_resume, 0, ref_resave(P, base), f"{w}/m1.jsonl", ck)
            ok = ok and b_ok
            why.append(b_why)
        P.record(cat, f"resave-{sc}@{k}", ok, "; ".join(why), secs)


def ref_resave(P, base):
    return losses(f"{base}/resave_src.jsonl")


# ---- section 2: signals, preemption, watchdog
def sig_model(P, d, m, steps=100000, extra=()):
    a = ["train", P.C, "--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.seq_len=32",
         "--set", "train.global_batch=8", "--set", "train.threads=1", "--set", f"train.steps={steps}",
         "--set", f'data.train="{P.path("data", "train.bin")}"', "--set", 'data.val=""',
         "--set", "data.eval_every=0", "--set", "log.progress=true", "--set", f'log.metrics="{m}"']
    if d:
        a += ["--set", f'checkpoint.dir="{d}"']
    for s in extra:
        a += ["--set", s]
    return a


# id, ranks, sets, checkpoint.dir?, trigger, target, signal, accepted rc, message, quick
SCENARIOS = [
    ("T1", 0, [], True, "setup", "r0", "TERM", {75}, r"received SIGTERM (during set-up|after step)", True),
    ("T2", 0, [], True, "steps", "r0", "TERM", {75}, r"received SIGTERM after step", True),
    ("T3", 0, [], True, "steps", "r0", "USR1", {75}, r"received SIGUSR1 after step", False),
    ("T4", 0, ["checkpoint.every=1"], True, "save", "r0", "TERM", {75}, r"received SIGTERM", True),
    ("T5", 0, ["checkpoint.every=1", "checkpoint.async=true"], True, "save", "r0", "TERM", {75},
     r"received SIGTERM", False),
    ("T6", 0, [], False, "steps", "r0", "TERM", {143}, r"nothing saved", True),
    ("T7", 0, [], True, "steps", "r0", "INT", {-2, 130}, None, False),
    ("T8", 0, [], True, "steps", "r0", "HUP", {-1, 129}, None, False),
    ("T9", 2, ["parallel.dp=2"], True, "steps", "r1", "TERM", {75, 1}, r"received SIGTERM", True),
    ("T10", 2, ["parallel.dp=2"], True, "steps", "mpirun", "USR1", {75, 1}, r"received SIGUSR1", True),
    ("T11_Q6", 2, ["parallel.dp=2"], True, "steps", "mpirun", "TERM", {75, 1}, r"received SIGTERM", False),
    ("T12", 2, ["parallel.pp=2"], True, "setup", "r0", "TERM", {75, 1}, r"received SIGTERM", False),
    ("T13", 2, ["parallel.pp=2", "checkpoint.every=1"], True, "save", "r1", "TERM", {75, 1},
     r"received SIGTERM", True),
    ("T14", 2, ["parallel.tp=2"], True, "steps", "all", "USR1", {75, 1}, r"received SIGUSR1", False),
    ("T15", 2, ["parallel.dp=2", "parallel.zero=1", "checkpoint.every=1", "checkpoint.async=true"], True,
     "save", "r1", "TERM", {75, 1}, r"received SIGTERM", True),
    ("T16", 2, ["parallel.dp=2"], True, "setup", "mpirun", "USR1", {75, 1}, r"received SIGUSR1", False),
    ("T17", 0, [], True, "last", "r0", "TERM", {0, 75}, None, False),
    ("T18", 2, ["parallel.dp=2"], True, "steps", "all", "TERM+USR1", {75, 1}, r"received SIG", False),
    ("T19_Q6", 2, ["parallel.dp=2"], True, "launch", "mpirun", "USR1", {0, 75, 1}, None, False),
    ("W1", 2, ["parallel.dp=2", "train.timeout_s=10"], True, "steps", "r1", "STOP", {14},
     r'watchdog: rank \d .*no progress for 1\d\.\d s.*communicator "(dp|world)"', True),
    ("W2", 2, ["parallel.pp=2", "train.timeout_s=10"], True, "steps", "r0", "STOP", {14},
     r'watchdog: rank 1 .*communicator "(pp|world)"', True),  # its receive, or the step's statistics
    ("W3", 2, ["parallel.tp=2", "train.timeout_s=10"], True, "steps", "r1", "STOP", {14},
     r'watchdog: rank 0 .*communicator "(tp|world)"', False),
    ("W4", 2, ["parallel.dp=2", "train.timeout_s=10", "checkpoint.every=1"], True, "save", "r1", "STOP", {14},
     r"watchdog: rank 0 ", False),
    ("W5", 2, ["parallel.dp=2", "train.timeout_s=10"], True, "setup", "r1", "STOP", {14},
     r"watchdog: rank 0 .*(setup|step)", False),
    ("W6_Q6", 2, ["parallel.dp=2", "train.timeout_s=10"], True, "steps", "mpirun", "STOP15", {0, 14}, None, False),
    ("W7", 2, ["parallel.dp=2", "parallel.zero=1", "train.timeout_s=10", "checkpoint.every=1",
               "checkpoint.async=true"], True, "save", "r1", "STOP", {14}, r"watchdog: rank 0 ", False),
    ("K1", 2, ["parallel.pp=2", 'parallel.schedule="zb-h1"'], True, "steps", "r1", "KILL", None, None, True),
    ("K2", 2, ["parallel.dp=2", "parallel.zero=1", 'parallel.grad_sync_progress="thread"'], True, "steps", "r0",
     "KILL", None, None, False),
    ("K3", 2, ["parallel.dp=2"], True, "setup", "r1", "KILL", None, None, True),
    ("K4", 2, ["parallel.dp=2", "checkpoint.every=1", "checkpoint.async=true"], True, "save", "r1", "KILL",
     None, None, False),
]


def signals(P):
    cat = "2-signals"
    for sid, np, sets, with_ck, trigger, target, sig, rcs, pat, q in SCENARIOS:
        if P.quick() and not q:
            continue
        w = P.path("sig", sid)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        d = f"{w}/ck" if with_ck else None
        m = f"{w}/m.jsonl"
        # W6 is a run that ends while mpirun is stopped (the report's 60 steps)
        steps = 30 if trigger == "last" else 60 if sid.startswith("W6") else 100000
        p = launch(P, sig_model(P, d, m, steps=steps, extra=sets), np, out=f"{w}/run")
        err = f"{w}/run.err"
        t_end = time.time() + 60
        fired = True
        while time.time() < t_end and p.poll() is None:
            if trigger == "launch" and time.time() - p._t0 >= 0.05:
                break
            if trigger == "setup" and read(err) and not losses(m) and (np == 0 or len(children_ranks(p.pid)) == np):
                break
            if trigger == "steps" and len(losses(m)) >= 5:
                break
            if trigger == "last" and 29 in losses(m):
                break
            if trigger == "save" and d and os.path.isdir(d) and any(x.startswith(".tmp-step_") for x in os.listdir(d)):
                break
            time.sleep(0.002)
        else:
            fired = False
        pids = rank_pids(p, np, wait=2)
        tgt = {"r0": [pids.get(0)], "r1": [pids.get(1)], "all": list(pids.values()), "mpirun": [p.pid]}[target]
        tgt = [x for x in tgt if x]
        t_sig = time.time()

        def send(s):
            for pid in tgt:
                try:
                    os.kill(pid, s)
                except ProcessLookupError:
                    pass
        if sig == "TERM+USR1":
            send(signal.SIGTERM)
            time.sleep(0.05)
            send(signal.SIGUSR1)
        elif sig == "STOP15":
            send(signal.SIGSTOP)
            time.sleep(15)
            send(signal.SIGCONT)
        else:
            send(getattr(signal, "SIG" + sig))
        bound = 30 if sig.startswith("STOP") else 15
        if trigger == "last":
            bound = 60
        rc, secs, to = finish(p, bound)
        after = time.time() - t_sig
        e = read(err)
        why = [f"{sig} to {target} on {trigger}{'' if fired else ' (trigger not seen)'}: rc {rc}, "
               f"{after:.1f} s after"]
        ok = not to and fired
        if to:
            why.append(f"HANG: no exit within {bound} s")
        if rcs is not None and rc not in rcs:
            ok = False
            why.append(f"expected rc {sorted(rcs)}")
        if rcs is None:  # a SIGKILLed rank: the job ends quickly, not 0
            if rc == 0 or after > 5:
                ok = False
                why.append("expected the job to end non-zero within 5 s")
        if sig.startswith("STOP") and rcs == {14} and after > 10 + 8:
            ok = False
            why.append("the watchdog took more than timeout_s + 8 s")
        if pat:
            hits = re.findall(pat, e)
            if not hits:
                ok = False
                why.append(f"no /{pat}/ in stderr: {e.strip().splitlines()[-1:] if e.strip() else ''}")
            elif len(hits) > max(np, 1) * (2 if sig == "TERM+USR1" else 1):
                ok = False
                why.append(f"/{pat}/ {len(hits)} times")
        if CRASH_RE.search(e):
            ok = False
            why.append("crash: " + CRASH_RE.search(e).group(0))
        for pid in pids.values():  # a stopped rank the watchdog's abort left
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        lo, lw = no_leftovers(w)
        if not lo:
            ok = False
            why.append(lw)
        if d:
            s_ok, s_why, step = P.ckpt_sound(d)
            ok = ok and s_ok
            why.append(s_why)
            if rc == 75 or (np and rc == 1 and sig in ("TERM", "USR1", "TERM+USR1") and target != "mpirun"):
                if step is None and "during set-up" not in e:
                    ok = False
                    why.append("stopped by a signal but nothing saved")
            if trigger == "last" and step != 30:
                ok = False
                why.append(f"the final step is {step}, not 30")
        P.record(cat, sid, ok, "; ".join(why), secs)
