#!/usr/bin/env python3
"""Chaos runs of mnist_replica (docs/ELASTIC.md; the long form of
tests/integration/elastic_allreduce.sh). Prints one JSON line per run.

Modes:
  async      1 ps + 3 workers, asynchronous; the ps (which the chief's checkpoints restore) killed once
  sync       1 ps + 3 workers, sync replicas aggregating 2 of 3 (a backup worker); the ps killed once
  synclive   1 ps + 3 workers, sync replicas aggregating all 3 while they live (--sync_live_probe_ms
             200: the chief averages the gradients of the workers that answer); the ps killed once
  allreduce  1 coordinator (the ps task) + 3 workers, --all_reduce --elastic
  grow       all-reduce from 2 workers to 4 and back to 2 (the two added ones SIGKILLed), against a
             fixed run of 2
  tfps       the other peer: TensorFlow's ParameterServerStrategy with a ClusterCoordinator
             (bench/peers/tf_ps_coordinator.py, TF_PYTHON: a venv with tensorflow-cpu): 1 ps, 3 workers
             and the coordinator; workers killed as above, the ps killed once (TensorFlow then
             fails the coordinator, which must be started again by hand: counted, not retried)
  torchrun   the peer: 3 torchrun agents (--nnodes 1:4, c10d rendezvous, DDP over gloo,
             --max_restarts) of bench/peers/torch_elastic.py, the same model; a kill takes an agent
             and its worker, and the agent is started again after 0-5 s (Debian's python3-torch)

In the chaos runs a random worker is SIGKILLed every 10-15 s and started again after 0-5 s.
Measured from the programs' own timestamped lines (--log_every 10): whether every process ended
under the hard deadline (no hang), the exit codes of the processes never killed, how long after
each kill the survivors made progress again (the first newer global step, or for all-reduce the
next epoch), how long a restarted worker took to train its first step, and the final accuracy
against the fault-free run of the same mode.

  bench/elastic_chaos.sh [MODE...]        (default: async sync allreduce grow)
  STEPS=30000 RUNS=1 SEED=1 bench/elastic_chaos.sh allreduce
  TORCH_PYTHON=/usr/bin/python3 bench/elastic_chaos.sh torchrun
  TORCH_SPARE_STORE=1 bench/elastic_chaos.sh torchrun    (never kill agent 0, which hosts the c10d store)
"""
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DG_BIN_DIR", os.path.join(ROOT, "build", "bin"))
# Global steps per mode: runs of one to two minutes on 2 cores, so that several kills land.
DEFAULT_STEPS = {"async": 150000, "sync": 30000, "synclive": 30000, "allreduce": 40000, "grow": 40000, "torchrun": 15000,
                 "tfps": 10000}
STEPS = None   # the mode's, set by main
RUNS = int(os.environ.get("RUNS", "1"))
SEED = int(os.environ.get("SEED", "1"))
DEADLINE_S = float(os.environ.get("DEADLINE_S", "900"))
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "/usr/bin/python3")   # Debian's, with python3-torch
TF_PYTHON = os.environ.get("TF_PYTHON", "python3")

STEP_RE = re.compile(r"^([0-9.]+): Worker (\d+): training step (\d+) done \(global step: (\d+)\)")
EPOCH_RE = re.compile(r"^([0-9.]+): elastic: /job:worker/task:(\d+): epoch (\d+) \(([^)]*)\)")
ACC_RE = re.compile(r"^Worker (\d+): validation accuracy = ([0-9.]+)")


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Job:
    def __init__(self, mode, chaos, tmp, rng):
        self.mode, self.chaos, self.tmp, self.rng = mode, chaos, tmp, rng
        n_workers = 4 if mode == "grow" else 3
        ports = free_ports(1 + n_workers)
        self.hosts = ["--ps_hosts", "127.0.0.1:%d" % ports[0], "--worker_hosts",
                      ",".join("127.0.0.1:%d" % p for p in ports[1:])]
        self.ckpt = os.path.join(tmp, "ckpt.db")
        common = ["--train_steps", str(STEPS), "--log_every", "10", "--quiet", "--seed", str(SEED)]
        if mode in ("async", "sync", "synclive"):
            common += ["--checkpoint_path", self.ckpt, "--save_checkpoint_steps", "500", "--rpc_timeout_ms", "2000",
                       "--recovery_attempts", "60"]
        if mode == "async":
            common += ["--learning_rate", "0.005"]
        if mode == "sync":
            common += ["--sync_replicas", "--replicas_to_aggregate", "2", "--sync_timeout_ms", "10000"]
        if mode == "synclive":
            common += ["--sync_replicas", "--sync_live_probe_ms", "200", "--sync_timeout_ms", "10000"]
        if mode in ("allreduce", "grow"):
            common += ["--all_reduce", "--elastic", "--elastic_min_workers", "2" if mode == "grow" else "3"]
        if mode == "grow" and not chaos:   # the fixed-size run: 2 workers, no elasticity
            self.hosts[3] = ",".join(self.hosts[3].split(",")[:2])
            common = ["--train_steps", str(STEPS), "--log_every", "10", "--quiet", "--seed", str(SEED),
                      "--all_reduce"]
        self.args = common
        self.procs = {}      # task -> Popen (current incarnation)
        self.logs = {}       # task -> [log paths]
        self.killed = []     # (time, task, global step at the kill)
        self.started = []    # (time, task, log) of restarts
        self.ps_kills = []
        self.ps = None
        self.ps_logs = []

    def start_ps(self):
        log = os.path.join(self.tmp, "ps%d.log" % len(self.ps_logs))
        self.ps_logs.append(log)
        self.ps = subprocess.Popen([os.path.join(BIN, "mnist_replica"), "--job_name", "ps", "--task_index", "0"]
                                   + self.hosts + ["--quiet"], stdout=open(log, "w"), stderr=subprocess.STDOUT)

    def start_worker(self, task):
        logs = self.logs.setdefault(task, [])
        log = os.path.join(self.tmp, "w%d_%d.log" % (task, len(logs)))
        logs.append(log)
        self.procs[task] = subprocess.Popen([os.path.join(BIN, "mnist_replica"), "--job_name", "worker",
                                             "--task_index", str(task)] + self.hosts + self.args,
                                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        return log

    def lines(self, task=None):
        """Every (time, task, global step) progress line so far."""
        out = []
        for t, logs in self.logs.items():
            if task is not None and t != task:
                continue
            for log in logs:
                with open(log, errors="replace") as f:
                    for line in f:
                        m = STEP_RE.match(line)
                        if m:
                            out.append((float(m.group(1)), int(m.group(2)), int(m.group(4))))
        return out

    def global_step(self):
        ls = self.lines()
        return max((g for _, _, g in ls), default=0)

    def running(self, task):
        p = self.procs.get(task)
        return p is not None and p.poll() is None

    def kill(self, task):
        step = self.global_step()
        self.procs[task].send_signal(signal.SIGKILL)
        self.procs[task].wait()
        self.killed.append((time.time(), task, step))


def run(mode, chaos, rng):
    tmp = tempfile.mkdtemp(prefix="dg-chaos-")
    job = Job(mode, chaos, tmp, rng)
    t0 = time.time()
    job.start_ps()
    first = [0, 1] if mode == "grow" else [0, 1, 2]
    for w in first:
        job.start_worker(w)
    hang = False
    never_killed = set(first)
    next_kill = t0 + rng.uniform(10, 15)
    pending = []             # (time, task) restarts due
    ps_kill_at = t0 + rng.uniform(20, 40) if chaos and mode in ("async", "sync", "synclive") else None
    grow_at = shrink_at = None
    if mode == "grow" and chaos:
        grow_at, shrink_at = t0 + 15, t0 + 40
    while True:
        now = time.time()
        done = all(not job.running(w) for w in job.procs)
        if done and not pending:
            break
        if now - t0 > DEADLINE_S:
            hang = True
            break
        if grow_at and now >= grow_at:
            for w in (2, 3):
                job.start_worker(w)
                job.started.append((time.time(), w, job.logs[w][-1]))
            grow_at = None
        if shrink_at and now >= shrink_at:
            for w in (2, 3):
                if job.running(w):
                    job.kill(w)
            shrink_at = None
        if chaos and mode != "grow" and now >= next_kill:
            alive = [w for w in (0, 1, 2) if job.running(w)]
            if alive and job.global_step() < STEPS * 0.9:
                victim = rng.choice(alive)
                job.kill(victim)
                never_killed.discard(victim)
                pending.append((time.time() + rng.uniform(0, 5), victim))
            next_kill = now + rng.uniform(10, 15)
        if ps_kill_at and now >= ps_kill_at and job.global_step() < STEPS * 0.9:
            step = job.global_step()
            job.ps.send_signal(signal.SIGKILL)
            job.ps.wait()
            t_kill = time.time()
            time.sleep(1)
            job.start_ps()
            job.ps_kills.append((t_kill, time.time(), step))
            ps_kill_at = None
        for due, w in list(pending):
            if time.time() >= due:
                pending.remove((due, w))
                log = job.start_worker(w)
                job.started.append((time.time(), w, log))
        time.sleep(0.05)
    wall = time.time() - t0
    for p in list(job.procs.values()) + [job.ps]:
        if p.poll() is None:
            p.kill()
            p.wait()
    # Resume: after each kill, the first progress line of another worker past the step at the kill.
    lines = job.lines()
    resume = []
    for t_kill, victim, step in job.killed:
        if mode == "grow":
            break
        after = [t for t, w, g in lines if t >= t_kill and w != victim and g > step]
        if mode == "allreduce":
            epochs = []
            for w, logs in job.logs.items():
                for log in logs:
                    for line in open(log, errors="replace"):
                        m = EPOCH_RE.match(line)
                        if m and m.group(4) == "after a failure" and float(m.group(1)) >= t_kill:
                            epochs.append(float(m.group(1)))
            after = epochs + after   # whichever comes first: the next epoch, or a newer step
        resume.append(min(after) - t_kill if after else None)
    # The longest pause in the survivors' progress in the 10 s after each kill (their lines come
    # every 10 steps): a stall shows here even when a line logged just after the kill was
    # computed before it.
    stalls = []
    for t_kill, victim, step in job.killed:
        ts = sorted(t for t, w, g in lines if w != victim and t_kill - 0.5 <= t <= t_kill + 10)
        gaps = [b - a for a, b in zip(ts, ts[1:]) if b >= t_kill]
        stalls.append(round(max(gaps), 3) if gaps else None)
    # Steps redone: all-reduce rolls back to its commit; a restarted ps restores the chief's
    # newest checkpoint.
    redone = []
    undone_re = re.compile(r"^([0-9.]+): elastic: .*rolled back to the commit of global step \d+ \((\d+) steps undone\)")
    restored_re = re.compile(r"restored checkpoint of global step (\d+)")
    for t_kill, victim, step in job.killed:
        n = 0
        for w, logs in job.logs.items():
            for log in logs:
                for line in open(log, errors="replace"):
                    m = undone_re.match(line)
                    if m and 0 <= float(m.group(1)) - t_kill < 5:
                        n = max(n, int(m.group(2)))
        redone.append(n)
    ps_resume = []
    for t_kill, t_restart, step in job.ps_kills:
        after = [t for t, w, g in lines if t >= t_restart]
        ps_resume.append(round(min(after) - t_kill, 3) if after else None)
        for log in job.logs.get(0, []):
            for line in open(log, errors="replace"):
                m = restored_re.search(line)
                if m and int(m.group(1)) <= step:
                    redone.append(step - int(m.group(1)))
    join = []
    for t_start, w, log in job.started:
        ls = []
        for line in open(log, errors="replace"):
            m = STEP_RE.match(line)
            if m:
                ls.append(float(m.group(1)))
                break
        # log_every 10: the first line is 10 local steps in; the first step came before it.
        join.append(ls[0] - t_start if ls else None)
    accs = {}
    codes = {}
    for w, logs in job.logs.items():
        for line in open(logs[-1], errors="replace"):
            m = ACC_RE.match(line)
            if m:
                accs[w] = float(m.group(2))
        codes[w] = job.procs[w].returncode
    survivors_ok = all(codes.get(w) == 0 for w in never_killed)
    acc = statistics.mean(accs.values()) if accs else None
    return {"wall_s": round(wall, 1), "hang": hang, "kills": len(job.killed), "ps_kills": len(job.ps_kills),
            "survivors_exit_0": survivors_ok, "resume_s": [None if r is None else round(r, 3) for r in resume],
            "join_s": [None if j is None else round(j, 3) for j in join], "accuracy": acc,
            "steps_redone": redone, "ps_resume_s": ps_resume, "stall_s": stalls,
            "accuracies": accs, "tmp": tmp}


TORCH_STEP_RE = re.compile(r"^(?:\[[^]]*\]:)?([0-9.]+): step (\d+)")
TORCH_RESTORED_RE = re.compile(r"^(?:\[[^]]*\]:)?RESTORED ([0-9.]+) step (\d+)")
TORCH_DONE_RE = re.compile(r"^(?:\[[^]]*\]:)?DONE accuracy=([0-9.]+)")


def run_torchrun(chaos, rng):
    """3 torchrun agents of bench/peers/torch_elastic.py; with chaos, a random agent (its process
    group: the agent and its worker) SIGKILLed every 10-15 s and started again after 0-5 s."""
    tmp = tempfile.mkdtemp(prefix="dg-chaos-torch-")
    port = free_ports(1)[0]
    script = os.path.join(ROOT, "bench", "peers", "torch_elastic.py")
    agents, logs = {}, {}

    def start(i):
        log = os.path.join(tmp, "agent%d_%d.log" % (i, len(logs.get(i, []))))
        logs.setdefault(i, []).append(log)
        agents[i] = subprocess.Popen(
            # --redirects/--tee 1: under Python 3.11 Debian's torch 1.13 cannot parse their default "0"
            # (Std.from_str finds no zero flag), so the worker's stdout is teed explicitly.
            [TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes", "1:4", "--nproc_per_node", "1",
             "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(tmp, "torch_logs"),
             "--max_restarts", "100", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port,
             "--rdzv_id", "chaos", script, "--steps", str(STEPS), "--ckpt", os.path.join(tmp, "ckpt.pt"),
             "--seed", str(SEED)],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))

    def progress():
        out = []
        for i, ls in logs.items():
            for log in ls:
                for line in open(log, errors="replace"):
                    m = TORCH_STEP_RE.match(line)
                    if m:
                        out.append((float(m.group(1)), int(m.group(2))))
        return out

    t0 = time.time()
    for i in range(3):
        start(i)
        if i == 0:
            time.sleep(1)   # agent 0 binds the rendezvous endpoint first, so it hosts the c10d store
    kills, pending, hang = [], [], False
    next_kill = None   # the kills begin once training has (its rendezvous waits for more agents first)
    while True:
        now = time.time()
        if all(a.poll() is not None for a in agents.values()) and not pending:
            break
        if now - t0 > DEADLINE_S:
            hang = True
            break
        if next_kill is None and progress():
            next_kill = now + rng.uniform(10, 15)
        if chaos and next_kill is not None and now >= next_kill:
            alive = [i for i, a in agents.items() if a.poll() is None]
            step = max((s for _, s in progress()), default=0)
            if os.environ.get("TORCH_SPARE_STORE") == "1":
                alive = [i for i in alive if i != 0]   # agent 0 hosts the c10d store: spare it
            if alive and step < STEPS * 0.9:
                v = rng.choice(alive)
                os.killpg(agents[v].pid, signal.SIGKILL)
                agents[v].wait()
                kills.append((time.time(), step, v))
                pending.append((time.time() + rng.uniform(0, 5), v))
            next_kill = now + rng.uniform(10, 15)
        for due, i in list(pending):
            if time.time() >= due:
                pending.remove((due, i))
                start(i)
        time.sleep(0.05)
    wall = time.time() - t0
    codes = [a.poll() for a in agents.values()]
    for a in agents.values():
        if a.poll() is None:
            try:
                os.killpg(a.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            a.wait()
    prog = progress()
    restored = []
    acc = None
    for i, ls in logs.items():
        for log in ls:
            for line in open(log, errors="replace"):
                m = TORCH_RESTORED_RE.match(line)
                if m:
                    restored.append((float(m.group(1)), int(m.group(2))))
                m = TORCH_DONE_RE.match(line)
                if m:
                    acc = float(m.group(1))
    resume, redone = [], []
    for t_kill, step, _ in kills:
        # Every worker starts again from the checkpoint: training resumes with the first step
        # after the first restore that followed the kill.
        r = sorted((t, s) for t, s in restored if t >= t_kill)
        after = [t for t, s in prog if r and t >= r[0][0]]
        resume.append(round(min(after) - t_kill, 3) if after else None)
        redone.append(step - r[0][1] if r else None)
    # Agent 0 hosts the c10d rendezvous store (its endpoint): killing it ends the job.
    return {"wall_s": round(wall, 1), "hang": hang, "kills": len(kills), "ps_kills": 0, "survivors_exit_0": None,
            "killed_agents": [v for _, _, v in kills], "agent_exit_codes": codes,
            "resume_s": resume, "join_s": [], "steps_redone": redone, "accuracy": acc, "tmp": tmp}


def run_tfps(chaos, rng):
    """TensorFlow's ParameterServerStrategy: a ps, 3 workers and the coordinator."""
    tmp = tempfile.mkdtemp(prefix="dg-chaos-tf-")
    ports = free_ports(5)
    cluster = json.dumps({"ps": ["127.0.0.1:%d" % ports[0]],
                          "worker": ["127.0.0.1:%d" % p for p in ports[1:4]], "chief": ["127.0.0.1:%d" % ports[4]]})
    script = os.path.join(ROOT, "bench", "peers", "tf_ps_coordinator.py")
    procs, n_logs = {}, {}

    def start(role, i, extra=()):
        k = (role, i)
        n_logs[k] = n_logs.get(k, 0) + 1
        log = os.path.join(tmp, "%s%d_%d.log" % (role, i, n_logs[k]))
        procs[k] = subprocess.Popen([TF_PYTHON, script, "--role", role, "--index", str(i), "--cluster", cluster]
                                    + list(extra), stdout=open(log, "w"), stderr=subprocess.STDOUT)
        return log

    start("ps", 0)
    for i in range(3):
        start("worker", i)
    chief_log = start("chief", 0, ["--steps", str(STEPS), "--seed", str(SEED)])
    t0 = time.time()
    kills, pending, ps_kills, hang = [], [], [], False
    next_kill = ps_kill_at = None   # the kills begin once training has (TensorFlow starts slowly)

    def progress():
        out = []
        for line in open(chief_log, errors="replace"):
            m = TORCH_STEP_RE.match(line)
            if m:
                out.append((float(m.group(1)), int(m.group(2))))
        return out

    while procs[("chief", 0)].poll() is None:
        now = time.time()
        if now - t0 > DEADLINE_S:
            hang = True
            break
        if next_kill is None and progress():
            next_kill = now + rng.uniform(10, 15)
            ps_kill_at = now + rng.uniform(20, 40) if chaos else None
        if chaos and next_kill is not None and now >= next_kill:
            alive = [i for i in range(3) if procs[("worker", i)].poll() is None]
            step = max((s for _, s in progress()), default=0)
            if alive and step < STEPS * 0.9:
                v = rng.choice(alive)
                procs[("worker", v)].kill()
                procs[("worker", v)].wait()
                kills.append((time.time(), step))
                pending.append((time.time() + rng.uniform(0, 5), v))
            next_kill = now + rng.uniform(10, 15)
        if ps_kill_at and now >= ps_kill_at:
            procs[("ps", 0)].kill()
            procs[("ps", 0)].wait()
            ps_kills.append(time.time())
            time.sleep(1)
            start("ps", 0)
            ps_kill_at = None
        for due, i in list(pending):
            if time.time() >= due:
                pending.remove((due, i))
                start("worker", i)
        time.sleep(0.05)
    wall = time.time() - t0
    chief_rc = procs[("chief", 0)].poll()
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    prog = progress()
    acc = None
    for line in open(chief_log, errors="replace"):
        m = TORCH_DONE_RE.match(line)
        if m:
            acc = float(m.group(1))
    resume = []
    for t_kill, step in kills:
        after = [t for t, s in prog if t >= t_kill]
        resume.append(round(min(after) - t_kill, 3) if after else None)
    gaps = [b[0] - a[0] for a, b in zip(prog, prog[1:])]
    return {"wall_s": round(wall, 1), "hang": hang, "kills": len(kills), "ps_kills": len(ps_kills),
            "survivors_exit_0": None, "coordinator_exit": chief_rc, "resume_s": resume, "join_s": [],
            "steps_done": prog[-1][1] if prog else 0, "progress_interval_s": round(statistics.median(gaps), 3) if gaps else None,
            "accuracy": acc, "tmp": tmp}


def main():
    modes = sys.argv[1:] or ["async", "sync", "allreduce", "grow"]
    cpu = subprocess.run([os.path.join(BIN, "dg-inspect"), "cpu"], capture_output=True, text=True).stdout.strip()
    global STEPS
    for mode in modes:
        STEPS = int(os.environ.get("STEPS", DEFAULT_STEPS.get(mode, 30000)))
        for r in range(RUNS):
            rng = random.Random(SEED * 1000 + r)
            runner = {"torchrun": run_torchrun, "tfps": run_tfps}.get(mode, lambda c, g: run(mode, c, g))
            base = runner(False, rng)
            chaos = runner(True, rng)
            res = [x for x in chaos["resume_s"] if x is not None]
            joins = [x for x in chaos["join_s"] if x is not None]
            print(json.dumps({
                "bench": "elastic_chaos", "mode": mode, "run": r, "steps": STEPS, "cpu": cpu,
                "fault_free": {"accuracy": base["accuracy"], "wall_s": base["wall_s"], "hang": base["hang"]},
                "chaos": {k: chaos.get(k) for k in ("accuracy", "wall_s", "hang", "kills", "ps_kills",
                                                    "survivors_exit_0", "resume_s", "join_s", "steps_redone",
                                                    "ps_resume_s", "coordinator_exit", "steps_done",
                                                    "progress_interval_s", "killed_agents", "agent_exit_codes",
                                                    "stall_s")},
                "resume_s_max": max(res) if res else None, "join_s_max": max(joins) if joins else None,
                "resumed_all": len(res) == len(chaos["resume_s"]),
                "accuracy_lost": None if base["accuracy"] is None or chaos["accuracy"] is None
                else round(base["accuracy"] - chaos["accuracy"], 4),
                "logs": chaos["tmp"]}), flush=True)


if __name__ == "__main__":
    main()
