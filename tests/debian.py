"""Installing the Debian packages a test needs (CI machines start without them; tests run as root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading

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

CHROMIUM = (["chromium", "chromedriver"], ["chromium", "chromium-driver"])
"""The browser and its WebDriver: binaries, then packages."""
EGL = (["libEGL.so.1"], ["libegl1", "libegl-mesa0", "libgl1-mesa-dri"])
"""Headless OpenGL for MuJoCo's renderer: libraries, then packages."""


_early: threading.Thread | None = None
"""The installs :func:`install_early` started, if any: what needs them waits for them first."""
installing: set[int] = set()
"""The pids of the ``apt-get`` processes running now: tests that count the processes a run leaves behind
leave these (and what they start) out."""


def missing(binaries: list[str]) -> bool:
    return not all(shutil.which(b) for b in binaries)


def missing_libraries(sonames: list[str]) -> bool:
    known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return not all(f"{name} " in known for name in sonames)


def ensure(binaries: list[str], packages: list[str]) -> None:
    """``apt-get install packages`` unless every one of ``binaries`` is already on PATH."""
    _wait_for_early()
    if missing(binaries):
        install(packages)


def ensure_libraries(sonames: list[str], packages: list[str]) -> None:
    """``apt-get install packages`` unless the dynamic linker already knows every one of ``sonames``."""
    _wait_for_early()
    if missing_libraries(sonames):
        install(packages)


def install_early(packages: list[str]) -> None:
    """Start ``apt-get install packages`` in a thread while the tests that do not need them run (on a
    fresh CI machine the downloads take minutes). :func:`ensure` waits for it; should it fail,
    ``ensure``'s own install runs again and raises the error where a test needs the package."""
    global _early
    if not packages or os.geteuid() != 0 or _early is not None:
        return

    def run() -> None:
        with contextlib.suppress(Exception):  # reported by the test that needs the package (ensure)
            install(packages)

    _early = threading.Thread(target=run, name="apt-get", daemon=True)
    _early.start()


def _wait_for_early() -> None:
    if _early is not None:
        _early.join()


def install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(packages)} missing, and installing them needs root (apt-get install)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        installing.add(proc.pid)
        try:
            stdout, stderr = proc.communicate()
        finally:
            installing.discard(proc.pid)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{stdout[-2000:]}\n{stderr[-2000:]}")


if __name__ == "__main__":  # python tests/debian.py BINARY PACKAGE [BINARY PACKAGE ...]
    import sys

    pairs = sys.argv[1:]
    ensure(pairs[0::2], pairs[1::2])
