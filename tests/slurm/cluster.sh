# A private one-node Slurm cluster for tests (sourced by tests/test_slurm.sh).
# Everything lives under one directory: its own munged (key, socket), slurmctld and
# slurmd on free loopback ports, state, spool, logs and PMIx temp dirs; the Slurm
# commands find it through SLURM_CONF. No cgroups (proctrack/linuxproc,
# task/affinity), no accounting, node localhost at 127.0.0.1.
#
#   slurm_cluster_up DIR    start it; 0 when the node is idle, else 1 with the reason
#                           in SLURM_CLUSTER_ERROR (what it started is stopped again)
#   slurm_cluster_down DIR  stop every process it started and remove DIR; idempotent
#
# Daemons run as children of the test (-D / -F) with their pids in DIR; a detached
# watchdog also tears the cluster down if the test is killed without its traps.

# _slurm_port_free PORT: nobody has PORT bound (TCP, IPv4 or IPv6, any state).
_slurm_port_free() {
  local hex
  hex=$(printf ':%04X ' "$1")
  ! grep -qs -- "$hex" /proc/net/tcp /proc/net/tcp6
}

# _slurm_pick_port: a free port below the kernel's ephemeral range.
_slurm_pick_port() {
  local p i
  for i in $(seq 50); do
    p=$((10000 + RANDOM % 22000))
    if _slurm_port_free "$p" && [ "$p" != "${_slurm_taken:-}" ]; then echo "$p"; return 0; fi
  done
  return 1
}

_slurm_write_conf() {
  local d="$1" ctld_port="$2" slurmd_port="$3" cpus
  cpus=$(nproc)
  [ "$cpus" -ge 2 ] || cpus=2   # tests need two tasks; config_overrides lets us claim 2
  cat > "$d/slurm.conf" <<EOF
ClusterName=tessera-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.sock
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
TmpFS=$d/tmp
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MpiDefault=pmix
ReturnToService=2
MailProg=/bin/true
FirstJobId=$((1000 + RANDOM))
MessageTimeout=10
KillWait=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=64 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  # Slurm's PMIx plugin puts its per-step directories here (default /tmp, shared by
  # every cluster on the machine, named by job id).
  echo "PMIxCliTmpDirBase=$d/tmp" > "$d/mpi.conf"
}

# _slurm_kill_pids SIGNAL PID...: signal the live ones.
_slurm_kill_pids() {
  local sig="$1" p; shift
  for p in "$@"; do
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && kill "-$sig" "$p" 2>/dev/null
  done
  return 0
}

# _slurm_tagged_pids DIR: processes other than this shell whose environment names this
# cluster's slurm.conf: the daemons, step daemons (slurmstepd detaches from slurmd)
# and job tasks. Bash builtins only, so the scan never sees its own helpers.
_slurm_tagged_pids() {
  local want="SLURM_CONF=$1/slurm.conf" f p e
  for f in /proc/[0-9]*/environ; do
    p="${f#/proc/}"; p="${p%/environ}"
    [ "$p" = "$$" ] && continue
    while IFS= read -r -d '' e; do
      if [ "$e" = "$want" ]; then echo "$p"; break; fi
    done 2>/dev/null < "$f"
  done
}

slurm_cluster_down() {
  local d="$1"
  [ -n "$d" ] && [ -d "$d" ] || return 0
  [ -s "$d/watchdog.pid" ] && _slurm_kill_pids TERM "$(cat "$d/watchdog.pid")"
  _slurm_stop_daemons "$d"
  rm -rf "$d"
}

# _slurm_start_watchdog DIR: a detached process (not a descendant of the test, so a
# test runner killing the test's process tree leaves it) that tears the cluster down
# once the test's shell is gone. It carries no SLURM_CONF, so the sweep spares it, and
# it waits with a builtin (read -t on a FIFO), so killing it leaves no child behind.
_slurm_start_watchdog() {
  local d="$1" lib
  lib="$(readlink -f "${BASH_SOURCE[0]}")"
  mkfifo "$d/watchdog.fifo" || return 0
  ( env -u SLURM_CONF setsid bash -c '
      source "$1"; trap "" INT HUP
      exec 3<>"$3/watchdog.fifo"
      for _ in $(seq 3600); do kill -0 "$2" 2>/dev/null || break; read -r -t 1 -u 3; done
      rm -f "$3/watchdog.pid"; slurm_cluster_down "$3"' \
      slurm-watchdog "$lib" "$$" "$d" </dev/null >/dev/null 2>&1 &
    echo $! > "$d/watchdog.pid" )
}

# _slurm_alive NAME DIR: the daemon started as NAME is still running.
_slurm_alive() {
  [ -s "$2/$1.bgpid" ] && kill -0 "$(cat "$2/$1.bgpid")" 2>/dev/null
}

_slurm_log_tail() {
  local f
  for f in "$@"; do
    [ -s "$f" ] && { echo "--- $f"; grep -vE 'Could not open .* state file|Trying backup|No .* file .* to recover' "$f" | tail -5; }
  done
}

# _slurm_try_up DIR: one attempt at the whole bring-up.
_slurm_try_up() {
  local d="$1" ctld_port slurmd_port i state
  SLURM_CLUSTER_ERROR=""
  ctld_port=$(_slurm_pick_port) && _slurm_taken=$ctld_port && slurmd_port=$(_slurm_pick_port) \
    || { SLURM_CLUSTER_ERROR="no free TCP port found"; return 1; }
  _slurm_write_conf "$d" "$ctld_port" "$slurmd_port"
  export SLURM_CONF="$d/slurm.conf"

  # munged with a key of its own, on a socket of its own.
  if [ ! -s "$d/munge.key" ]; then
    mungekey --create --keyfile="$d/munge.key" 2>/dev/null \
      || dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$d/munge.key"
  fi
  munged --foreground --force --socket="$d/munge.sock" --key-file="$d/munge.key" \
    --pid-file="$d/munged.pid" --log-file="$d/munged.log" --seed-file="$d/munged.seed" \
    >"$d/munged.out" 2>&1 &
  echo $! > "$d/munged.bgpid"
  for i in $(seq 50); do
    timeout 5 munge --socket="$d/munge.sock" --no-input 2>/dev/null \
      | timeout 5 unmunge --socket="$d/munge.sock" >/dev/null 2>&1 && break
    _slurm_alive munged "$d" || break
    sleep 0.1
  done
  if ! timeout 5 munge --socket="$d/munge.sock" --no-input 2>/dev/null \
       | timeout 5 unmunge --socket="$d/munge.sock" >/dev/null 2>&1; then
    SLURM_CLUSTER_ERROR="munged did not start: $(_slurm_log_tail "$d/munged.out" "$d/munged.log")"
    return 1
  fi

  slurmctld -D >"$d/slurmctld.out" 2>&1 &
  echo $! > "$d/slurmctld.bgpid"
  slurmd -D -N localhost >"$d/slurmd.out" 2>&1 &
  echo $! > "$d/slurmd.bgpid"

  # Bounded wait (30 s) for the node to register and turn idle; stop early if a
  # daemon died.
  local why="" deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(timeout 5 sinfo --noheader --nodes=localhost --format=%t 2>/dev/null)
    [ "$state" = "idle" ] && return 0
    _slurm_alive slurmctld "$d" || why="slurmctld exited"
    _slurm_alive slurmd "$d" || why="${why:+$why, }slurmd exited"
    [ -n "$why" ] && break
    sleep 0.5
  done
  SLURM_CLUSTER_ERROR="${why:-the node did not become idle within 30 s (state '${state:-none}')}:
$(_slurm_log_tail "$d/slurmctld.out" "$d/slurmd.out")"
  return 1
}

slurm_cluster_up() {
  local d="$1" attempt
  # A job environment of the caller's own must not leak into this cluster's commands.
  unset $(compgen -v | grep -E '^(SLURM|SRUN|SALLOC|SBATCH|SQUEUE|SINFO|PMIX|PMI)_') 2>/dev/null
  SLURM_CLUSTER_ERROR=""
  mkdir -p "$d" && chmod 0700 "$d" || { SLURM_CLUSTER_ERROR="cannot create $d"; return 1; }
  _slurm_start_watchdog "$d"
  for attempt in 1 2; do
    mkdir -p "$d/state" "$d/spool" "$d/tmp"
    _slurm_try_up "$d" && return 0
    # A port taken between the check and the bind is worth one more try.
    grep -qs -E 'Address already in use|Unable to bind' "$d"/slurm*.out "$d"/slurm*.log || break
    _slurm_stop_daemons "$d"
  done
  _slurm_stop_daemons "$d"
  return 1
}

# _slurm_stop_daemons DIR: stop the jobs and daemons of the cluster in DIR (keeping
# DIR and the watchdog): jobs first, so step daemons end their tasks, munged last;
# then whatever still carries the cluster's SLURM_CONF gets TERM, later KILL.
_slurm_stop_daemons() {
  local d="$1" i pids
  if _slurm_alive slurmctld "$d"; then
    SLURM_CONF="$d/slurm.conf" timeout 5 scancel --quiet --user=root >/dev/null 2>&1
  fi
  for i in slurmd slurmctld munged; do
    [ -s "$d/$i.bgpid" ] && _slurm_kill_pids TERM "$(cat "$d/$i.bgpid")"
  done
  for i in $(seq 50); do
    pids=$(_slurm_tagged_pids "$d")
    [ -z "$pids" ] && break
    [ "$i" -eq 20 ] && _slurm_kill_pids TERM $pids
    [ "$i" -ge 35 ] && _slurm_kill_pids KILL $pids
    sleep 0.1
  done
  rm -rf "$d/state" "$d/spool" "$d/tmp" "$d"/*.bgpid
}
