"""The numbered examples run and verify their results: on the host emulator here (on GPUs where there are some).
02_processes runs as 4 processes started by hand with FIAR_* variables, and under mpirun when it is given.

  check_examples.py EXAMPLES_DIR [MPIRUN]
"""
import os
import re
import socket
import subprocess
import sys
import time

EXAMPLES = sys.argv[1]
MPIRUN = sys.argv[2] if len(sys.argv) > 2 else ""
failures = []


def check(ok, what, detail=""):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
        if detail:
            print(detail)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("FIAR_", "OMPI_", "PMI_", "SLURM_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


for name in ("01_threads", "03_decode_graph", "04_compile_time", "05_user_epilogue"):
    start = time.monotonic()
    p = subprocess.run([os.path.join(EXAMPLES, name)], capture_output=True, text=True, timeout=600, env=clean_env())
    check(p.returncode == 0 and re.search(rf"^{name}: PASS", p.stdout, re.M) is not None,
          f"{name}: exit 0 and PASS ({time.monotonic() - start:.1f} s)", p.stdout + p.stderr)

# 02: four processes started like N shell commands.
exe = os.path.join(EXAMPLES, "02_processes")
port = free_port()
start = time.monotonic()
procs = []
for r in range(4):
    env = clean_env()
    env.update(FIAR_RANK=str(r), FIAR_WORLD_SIZE="4", FIAR_MASTER_PORT=str(port))
    procs.append(subprocess.Popen([exe], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
outs = []
for p in procs:
    try:
        outs.append(p.communicate(timeout=600)[0])
    except subprocess.TimeoutExpired:
        p.kill()
        outs.append(p.communicate()[0] + "\n(killed at the deadline)")
ok = all(p.returncode == 0 for p in procs) and all(re.search(rf"rank {r} of 4 .*PASS", o) for r, o in enumerate(outs))
check(ok, f"02_processes: 4 processes with FIAR_RANK / FIAR_WORLD_SIZE, every rank PASS "
          f"({time.monotonic() - start:.1f} s)", "\n".join(outs))

# 02 without a launcher's variables: a clear message, exit 2.
p = subprocess.run([exe], capture_output=True, text=True, timeout=60, env=clean_env())
check(p.returncode == 2 and "FIAR_RANK and FIAR_WORLD_SIZE" in p.stderr,
      "02_processes without launcher variables: exit 2, names FIAR_RANK and FIAR_WORLD_SIZE", p.stderr)

if MPIRUN:
    cmd = [MPIRUN, "-np", "4", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd += ["-x", f"FIAR_MASTER_PORT={free_port()}", exe]
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())
    passes = len(re.findall(r"rank \d of 4 \(.*launched via Open MPI\): PASS", p.stdout))
    check(p.returncode == 0 and passes == 4,
          f"02_processes under mpirun -np 4: {passes} of 4 ranks PASS ({time.monotonic() - start:.1f} s)",
          p.stdout + p.stderr)
else:
    print("note: no mpirun: 02_processes under mpirun not run")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
