"""Graph and cluster files by name: ``dagrl run ppo-cartpole --cluster local`` as well as by path.

A name (no ``/``, with or without ``.yaml``) is looked up, first hit wins, in

1. ``$DAGRL_CONFIG_DIR/<kind>/`` (default ``~/.config/dagrl/<kind>/``): your own files;
2. the ``graphs/`` and ``clusters/`` beside the ``dagrl`` package (a source checkout);
3. ``<prefix>/share/dagrl/<kind>/``, where ``pip install`` puts the shipped files.

An existing file of that name in the working directory is taken as it is, as any path is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dagrl.core.schema import ConfigError, closest

__all__ = ["KINDS", "describe", "entries", "resolve", "search_dirs"]

KINDS = ("graphs", "clusters")


def search_dirs(kind: str) -> list[Path]:
    user = Path(os.environ.get("DAGRL_CONFIG_DIR") or Path.home() / ".config" / "dagrl")
    checkout = Path(__file__).resolve().parents[2]
    return [user / kind, checkout / kind, Path(sys.prefix) / "share" / "dagrl" / kind]


def entries(kind: str) -> dict[str, Path]:
    """Every file findable by name: name -> path (a user's file hides a shipped one of the same name)."""
    found: dict[str, Path] = {}
    for folder in search_dirs(kind):
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def resolve(kind: str, text: str | None, flag: str) -> str | None:
    """The file ``text`` names: itself if it is a path or an existing file, else the first of
    :func:`search_dirs` holding ``text`` or ``text.yaml``. ``flag`` names the argument in errors."""
    if text is None or "/" in text or os.sep in text or Path(text).exists():
        return text
    stem = text.removesuffix(".yaml")
    known = entries(kind)
    if stem in known:
        return str(known[stem])
    hint = closest(stem, known, f"`dagrl {kind}`")
    raise ConfigError(flag, "", f"{text}: no such file, and no {kind[:-1]} of that name ({hint})")


def describe(path: Path) -> str:
    """What a file is: a graph's ``description:`` (one line, checked when the graph loads), else the
    file's first comment line."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("description"), str):
        return data["description"]
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""
