"""Installing the Debian packages a test needs (CI machines start without them; tests run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess

HEADLESS_CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # this machine's closed network refuses its connections
    "--disable-component-update",
    "--disable-sync",
)
"""Debian's chromium as root on a machine with no screen and no outside network (tests, benchmarks)."""


def ensure(binaries: list[str], packages: list[str]) -> None:
    """``apt-get install packages`` unless every one of ``binaries`` is already on PATH."""
    if all(shutil.which(b) for b in binaries):
        return
    install(packages)


def ensure_libraries(sonames: list[str], packages: list[str]) -> None:
    """``apt-get install packages`` unless the dynamic linker already knows every one of ``sonames``."""
    known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if all(f"{name} " in known for name in sonames):
        return
    install(packages)


def install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(packages)} missing, and installing them needs root (apt-get install)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


if __name__ == "__main__":  # python tests/debian.py BINARY PACKAGE [BINARY PACKAGE ...]
    import sys

    pairs = sys.argv[1:]
    ensure(pairs[0::2], pairs[1::2])
