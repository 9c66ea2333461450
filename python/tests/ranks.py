"""Starts a rank script of this folder as a launcher would: one process per rank, with torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, …) and a free port."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys


def launch_ranks(script: str, world: int, args: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Runs python/tests/`script` as `world` processes and returns each one's outcome."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = pathlib.Path(__file__).with_name(script)
    ranks: list[subprocess.Popen[str]] = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PEERLINK_TIMEOUT="30",
        )
        ranks.append(
            subprocess.Popen(
                [sys.executable, str(path), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for process in ranks:
        stdout, stderr = process.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done
