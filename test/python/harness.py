# SPDX-License-Identifier: Apache-2.0
"""Ranks for fiar's Python tests: threads of this process meeting over a CommBackend made of threading primitives,
or processes started with fiar's launcher variables (the TCP bootstrap from the environment)."""
import json
import os
import re
import socket
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


class ThreadComm:
    """FlashInfer's CommBackend shape over threads: Get_rank, Get_size, allgather, barrier (every wait bounded)."""

    def __init__(self, shared, rank, world):
        self._shared, self._rank, self._world = shared, rank, world

    def Get_rank(self):  # noqa: N802 - FlashInfer's names
        return self._rank

    def Get_size(self):  # noqa: N802
        return self._world

    def allgather(self, data):
        self._shared["slots"][self._rank] = data
        self._shared["barrier"].wait(timeout=60)
        out = list(self._shared["slots"])
        self._shared["barrier"].wait(timeout=60)
        return out

    def barrier(self):
        self._shared["barrier"].wait(timeout=60)


def run_threads(world, body):
    """body(rank, comm) on one thread per rank; returns each rank's result, or what it raised."""
    shared = {"slots": [None] * world, "barrier": threading.Barrier(world)}
    results = [None] * world

    def one(rank):
        try:
            results[rank] = body(rank, ThreadComm(shared, rank, world))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            results[rank] = e
    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world, argv, launcher="fiar"):
    """argv as `world` processes with the launcher's variables (fiar: FIAR_RANK / FIAR_WORLD_SIZE /
    FIAR_MASTER_PORT; torchrun: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), output captured."""
    port = free_port()
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FIAR_", "OMPI_", "PMI_", "SLURM_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        if launcher == "torchrun":
            env.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        else:
            env.update(FIAR_RANK=str(r), FIAR_WORLD_SIZE=str(world), FIAR_MASTER_PORT=str(port))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def run_doc_example(page, tmp_path, launcher, world=2, timeout=180):
    """The python-example block of `page` (a path in the repository) written out and run as it says, as `world`
    processes with the launcher's variables; returns each process's (exit status, output)."""
    text = open(os.path.join(HERE, "..", "..", page)).read()
    block = re.search(r"<!-- python-example[^\n]*\n```python\n(.*?)```", text, re.S)
    assert block, f"{page} lost its python-example block"
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    procs = start_ranks(world, [sys.executable, str(script)], launcher)
    return [(p.communicate(timeout=timeout)[0], p.returncode)[::-1] for p in procs]


def run_processes(world, args, timeout=300, script="rank_main.py", launcher="fiar"):
    """test/python/SCRIPT ARGS... as `world` processes with the launcher's variables (start_ranks); returns each
    rank's JSON report (its last stdout line) and exit status."""
    procs = start_ranks(world, [sys.executable, os.path.join(HERE, script)] + list(args), launcher)
    reports = []
    for p in procs:
        try:
            out = p.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + "\n(killed at the deadline)"
        last = out.strip().splitlines()[-1] if out.strip() else ""
        try:
            report = json.loads(last)
        except ValueError:
            report = {"error": out}
        report["returncode"] = p.returncode
        reports.append(report)
    return reports
