"""The host emulator with its ranks as processes: groups of fiar-host-rank processes meeting over the TCP bootstrap (and
over MPI when mpirun is given), every pattern on every backend checked against the reference; the launchers'
variables; a rank that never arrives; a rank killed with SIGKILL in the middle of a sequence of calls (the others get
fiar::timeout_error within the timeout, none hangs, no shared memory is left, and a new group works afterwards).

  check_processes.py FIAR_HOST_RANK [MPIRUN]
"""
import os
import shutil
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

RANK_EXE = sys.argv[1]
MPIRUN = sys.argv[2] if len(sys.argv) > 2 else ""
failures = []
EXIT_TIMEOUT = 3


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port, style="fiar"):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FIAR_", "OMPI_", "PMI_", "SLURM_")) and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    if style == "fiar":
        env.update(FIAR_RANK=str(rank), FIAR_WORLD_SIZE=str(world), FIAR_MASTER_ADDR="127.0.0.1",
                   FIAR_MASTER_PORT=str(port))
    elif style == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="localhost",
                   MASTER_PORT=str(port))
    elif style == "openmpi":
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
                   OMPI_COMM_WORLD_LOCAL_RANK=str(rank), FIAR_MASTER_PORT=str(port))
    return env


class Group:
    """Starts one fiar-host-rank process per rank (those in `ranks`), each with its own output file."""

    def __init__(self, world, args, ranks=None, style="fiar"):
        self.port = free_port()
        self.ranks = list(range(world)) if ranks is None else ranks
        self.dir = tempfile.mkdtemp(prefix="fiar-procs-")
        self.procs = {}
        self.files = {}
        for r in self.ranks:
            path = os.path.join(self.dir, f"rank{r}.log")
            self.files[r] = path
            out = open(path, "w")
            self.procs[r] = subprocess.Popen([RANK_EXE] + args, env=rank_env(r, world, self.port, style),
                                             stdout=out, stderr=subprocess.STDOUT)
            out.close()

    def output(self, r):
        with open(self.files[r]) as f:
            return f.read()

    def wait(self, limit):
        """Each rank's exit code (None: still running at the limit, then killed) and the seconds it took."""
        deadline = time.monotonic() + limit
        codes = {}
        for r, p in self.procs.items():
            try:
                codes[r] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[r] = None
        return codes

    def pids(self):
        return [p.pid for p in self.procs.values()]

    def __del__(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def leftover_segments(pids):
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return [n for n in names if any(n.startswith(f"fiar-host-{pid}-") for pid in pids)]


def show(group, codes):
    for r in group.ranks:
        text = group.output(r).strip().splitlines()
        print(f"  rank {r}: exit {codes.get(r)}: {text[-1] if text else '(no output)'}")


def run_group(name, world, args, style="fiar", limit=600):
    start = time.monotonic()
    g = Group(world, args, style=style)
    codes = g.wait(limit)
    seconds = time.monotonic() - start
    ok = all(c == 0 for c in codes.values()) and all("PASS" in g.output(r) for r in g.ranks)
    check(ok, f"{name}: {world} processes, every rank PASS ({seconds:.1f} s)")
    if not ok:
        show(g, codes)
    check(not leftover_segments(g.pids()), f"{name}: no shared-memory segment left in /dev/shm")
    return g


# 1. Every pattern on every backend, 4 processes (bf16) and 3 processes (float), over the TCP bootstrap.
g = run_group("tcp bf16", 4, ["--dtype=bf16", "--calls=2"])
lines = g.output(0)
for backend in ("trtllm", "mnnvl", "nccl"):
    for pattern in ("allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8", "residual_rmsnorm_fp8_dynamic",
                    "residual_rmsnorm_nvfp4", "rmsnorm", "residual_rmsnorm_prepost", "residual_rmsnorm_fp8_group",
                    "residual_rmsnorm_mxfp8", "moe_finalize_allreduce", "moe_finalize_residual_rmsnorm"):
        check(re.search(rf"rank 0: {backend} {pattern}: 2 call\(s\), 0 mismatch", lines) is not None,
              f"tcp bf16: rank 0 ran {backend} {pattern}, 0 mismatches")
run_group("tcp float", 3, ["--dtype=float", "--calls=2", "--tokens=5"])
# The NCCL route of trtllm and mnnvl across processes: every call handed to the nested nccl workspace (its own
# shared-memory segments), checked against the reference and across ranks.
g = run_group("tcp, the NCCL route", 3, ["--backends=trtllm,mnnvl", "--nccl-min-bytes=0", "--calls=3",
                                          "--patterns=allreduce,residual_rmsnorm_fp8_dynamic"])
for backend in ("trtllm", "mnnvl"):
    check(re.search(rf"rank 0: {backend} residual_rmsnorm_fp8_dynamic: 3 call\(s\), 0 mismatch", g.output(0))
          is not None, f"the NCCL route: rank 0 ran {backend} through it, 0 mismatches")

# 2. The launchers' variables: torchrun's, and Open MPI's (with fiar's rendezvous port).
run_group("torchrun variables", 2, ["--backends=trtllm", "--patterns=residual_rmsnorm_fp8"], style="torchrun")
run_group("Open MPI variables", 2, ["--backends=nccl", "--patterns=allreduce"], style="openmpi")

# 3. A rank that never arrives: the others stop at the bootstrap's timeout, naming it.
start = time.monotonic()
g = Group(4, ["--bootstrap-ms=3000"], ranks=[0, 1, 3])
codes = g.wait(60)
seconds = time.monotonic() - start
check(all(c == EXIT_TIMEOUT for c in codes.values()) and seconds < 3 + 10,
      f"rank 2 never starts: ranks 0, 1, 3 exit with timeout_error ({seconds:.1f} s, bootstrap timeout 3 s)")
check("missing rank(s): 2" in g.output(0), "rank 0's timeout_error names the missing rank 2")
check(all("missing rank(s): 2" in g.output(r) for r in (1, 3)),
      "ranks 1 and 3 report rank 0's verdict (missing rank 2), not just their own wait")
if any(c != EXIT_TIMEOUT for c in codes.values()):
    show(g, codes)


# 4. SIGKILL in the middle of a sequence of calls, while the others wait in a kernel (--no-compare) or in the bootstrap.
def kill_case(backend, mode):
    timeout_s = 3
    args = ["--calls=1000000", "--progress", f"--backends={backend}", "--patterns=residual_rmsnorm",
            f"--timeout-ms={timeout_s * 1000}", "--bootstrap-ms=20000"] + (["--no-compare"] if mode == "kernel" else [])
    g = Group(4, args)
    victim = g.procs[2]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "rank 2 call 50\n" not in g.output(2) and victim.poll() is None:
        time.sleep(0.05)
    started = "rank 2 call 50\n" in g.output(2)
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    codes = g.wait(timeout_s + 30)
    took = time.monotonic() - killed_at
    name = f"SIGKILL ({backend}, survivors in the {mode})"
    survivors = [0, 1, 3]
    check(started, f"{name}: rank 2 ran 50 calls before it was killed")
    check(all(codes[r] == EXIT_TIMEOUT for r in survivors),
          f"{name}: ranks 0, 1, 3 exit with fiar::timeout_error")
    check(all(codes[r] is not None for r in survivors) and took < timeout_s + 10,
          f"{name}: every survivor ended {took:.1f} s after the kill (call timeout {timeout_s} s), none hung")
    # In a kernel the wait for rank 2's data times out; in the bootstrap rank 0 sees rank 2's connection close. A kill
    # in the bootstrap mode may also land while the others are in a kernel.
    # A survivor that was a step ahead (in the next call's kernel when the others failed in the bootstrap) waits for
    # every rank that stopped: "rank(s) 0, 2, 3".
    expect = [r"rank\(s\) [0-9, ]*\b2\b"] + ([] if mode == "kernel" else ["rank 2 left the group"])
    check(all(any(re.search(e, g.output(r)) for e in expect) for r in survivors),
          f"{name}: every survivor's error names rank 2 ({' or '.join(expect)})")
    check(not leftover_segments(g.pids()), f"{name}: no shared-memory segment left in /dev/shm")
    if any(codes[r] != EXIT_TIMEOUT for r in survivors):
        show(g, codes)


for backend in ("trtllm", "mnnvl", "nccl"):
    kill_case(backend, "kernel")
kill_case("trtllm", "bootstrap")

# 5. A new group in new processes works after all that.
run_group("a new group after the kills", 4, ["--backends=trtllm,nccl", "--patterns=allreduce,residual_rmsnorm_nvfp4"])

# 6. Launched by mpirun: the MPI bootstrap, and the TCP bootstrap from Open MPI's variables.
if MPIRUN:
    base = [MPIRUN, "-np", "4", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    for name, args, extra in (
            ("mpirun, MPI bootstrap", ["--bootstrap=mpi", "--calls=2"], []),
            ("mpirun, TCP bootstrap from Open MPI's variables", ["--bootstrap=tcp", "--backends=trtllm",
                                                                 "--patterns=residual_rmsnorm_fp8_dynamic"],
             ["-x", f"FIAR_MASTER_PORT={free_port()}"])):
        start = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIAR_")}
        p = subprocess.run(base + extra + [RANK_EXE] + args, env=env, capture_output=True, text=True, timeout=600)
        passes = len(re.findall(r"rank \d of 4: PASS", p.stdout))
        check(p.returncode == 0 and passes == 4,
              f"{name}: 4 processes, {passes} PASS ({time.monotonic() - start:.1f} s)")
        if p.returncode != 0 or passes != 4:
            print(p.stdout[-3000:], p.stderr[-3000:])
else:
    print("note: no mpirun (or fiar-host-rank built without MPI): the MPI bootstrap is not run")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
