"""Envs that leave marks on disk, so a test can see what happened to them in another process."""

from __future__ import annotations

import uuid
from pathlib import Path

import gymnasium as gym


class MarksClose(gym.Wrapper):
    """Writes ``made-<id>`` into ``folder`` when made and ``closed-<id>`` when closed."""

    def __init__(self, env: gym.Env, folder: str):
        super().__init__(env)
        self.mark = Path(folder) / uuid.uuid4().hex
        self.mark.parent.mkdir(parents=True, exist_ok=True)
        self.mark.with_name(f"made-{self.mark.name}").touch()

    def close(self) -> None:
        self.mark.with_name(f"closed-{self.mark.name}").touch()
        super().close()


def marks(folder: Path, kind: str) -> set[str]:
    return {p.name.removeprefix(f"{kind}-") for p in folder.glob(f"{kind}-*")}
