"""Typed loading of YAML-shaped dicts into dataclasses, with errors that name file, key and value."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")


ERROR_CHARS = 300
"""The longest an error line gets: a value quoted in one (a file, a key, a 160 MB expanded alias) is cut."""


def shown(value: Any) -> str:
    """``repr(value)`` as an error shows it: nested and long values cut (``reprlib``), so a value that
    expands to gigabytes (YAML aliases) is never written out."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother = 3, 6, 6, 80, 80
    return r.repr(value)


def bounded(text: str, most: int = ERROR_CHARS) -> str:
    """``text`` on one line of at most ``most`` characters (the middle cut out, marked)."""
    text = " ".join(str(text).split())
    if len(text) <= most:
        return text
    keep = (most - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"


class ConfigError(ValueError):
    """A user mistake in a config file or override: the message names the file, the key, the value, on
    one line of at most :data:`ERROR_CHARS` characters (the value's middle cut where it is long)."""

    def __init__(self, where: str | Path | None, key: str, problem: str):
        self.where, self.key = bounded(str(where or "<config>"), 120), bounded(key, 80)
        self.problem = bounded(problem, ERROR_CHARS - len(self.where) - len(self.key) - 4)
        text = f"{self.where}: {self.key}: {self.problem}" if key else f"{self.where}: {self.problem}"
        super().__init__(text)


MAX_ALIASES = 100
"""The most aliases (``*name``) a config file may use: enough for any hand-written file, too few for a
"billion laughs" file whose aliases expand to gigabytes."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML says keys are unique; PyYAML
    keeps the last) and more than :data:`MAX_ALIASES` aliases."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: more than {MAX_ALIASES} aliases (*name)")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise yaml.YAMLError(f"line {line}: key {key!r} given twice (first on line {seen[key]})")
                seen[key] = line
            except TypeError:
                continue  # an unhashable key: the base class says so
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with :class:`_StrictLoader`'s refusals."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, turning missing files and syntax errors into :class:`ConfigError`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(path, "", f"cannot read file ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(path, "", f"not UTF-8 text (byte {err.start}, line {line}): is it a graph file?") from None
    try:
        data = load_yaml(text)
    except ValueError as err:  # Python's own limits, e.g. an integer of over 4,300 digits
        raise ConfigError(path, "", f"malformed YAML: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(path, "", f"malformed YAML: {at}{problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, "", f"expected a mapping at top level, got {type(data).__name__}")
    return data


def parse_override(text: str, where: str = "--set") -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into a key path and a YAML-typed value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(where, text, "expected KEY=VALUE, e.g. hyperparameters.lr=3e-4")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except ValueError as err:
        raise ConfigError(where, key.strip(), f"malformed value: {err}") from None
    except yaml.YAMLError as err:
        if "aliases" in str(err) or "given twice" in str(err):
            raise ConfigError(where, key.strip(), str(err)) from None
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each ``dotted.key=value`` in a nested dict (creating mappings on the way)."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError("--set", text, f"{'.'.join(path[: i + 1])} is {child!r}, not a mapping")
            node = child
        node[path[-1]] = value
    return data


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def convert(value: Any, tp: Any, where: str | Path | None, key: str) -> Any:
    """Check ``value`` against the type annotation ``tp`` and return it converted."""
    origin = get_origin(tp)
    bad = ConfigError(where, key, f"expected {_type_name(tp)}, got {shown(value)}")
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise bad
        return value
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return convert(value, arg, where, key)
            except ConfigError:
                continue
        raise bad
    if tp is type(None):
        if value is not None:
            raise bad
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(where, key, f"expected a mapping, got {shown(value)}")
        return from_dict(tp, value, where, prefix=key)
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        ktp, vtp = get_args(tp) or (Any, Any)
        return {convert(k, ktp, where, f"{key}.{k}"): convert(v, vtp, where, f"{key}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise bad
        (etp, *_) = get_args(tp) or (Any,)
        items = [convert(v, etp, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        if not -(2**63) <= value < 2**63:
            raise ConfigError(where, key, f"{value} does not fit a 64-bit integer (arrays and seeds hold these)")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise bad


def closest(name: str, known: Iterable[str], where_listed: str = "") -> str:
    """What an error about an unknown ``name`` says of the ``known`` ones: the closest (``did you mean
    ppo-cartpole?``), never every name; with none close, ``where_listed`` (a command that lists them),
    or the names themselves where there are few.

    >>> closest("env_step", ["env_steps", "mean_return", "window"])
    'did you mean env_steps?'
    >>> closest("zzz", ["a", "b"])
    'expected one of: a, b'
    """
    known = list(known)
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if near:
        return "did you mean " + " or ".join(near) + "?"
    if where_listed:
        return f"{where_listed} lists them"
    if len(known) <= 8:
        return f"expected one of: {', '.join(known)}" if known else "there are none"
    return f"none of the {len(known)} names is close"


def from_dict(cls: type[T], data: dict[str, Any], where: str | Path | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`ConfigError`.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Stop:
    ...     env_steps: int = 100
    >>> from_dict(Stop, {"env_steps": 5}, "g.yaml")
    Stop(env_steps=5)
    >>> from_dict(Stop, {"env_step": 5}, "g.yaml")
    Traceback (most recent call last):
    ...
    dagrl.core.schema.ConfigError: g.yaml: env_step: unknown key (did you mean env_steps?)
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            raise ConfigError(where, key, f"unknown key ({closest(str(k), fields)})")
        kwargs[k] = convert(v, hints[k], where, key)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(where, f"{prefix}.{name}" if prefix else name, "required key is missing")
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(where, prefix, str(err)) from None
    return obj


def at_least(obj: Any, low: float, *names: str) -> None:
    """Raise ``ValueError`` naming the first of ``obj``'s fields ``names`` that is set and below ``low``.

    For a dataclass's ``__post_init__``; :func:`from_dict` turns the error into a :class:`ConfigError`.
    """
    for name in names:
        value = given = getattr(obj, name)
        if isinstance(value, tuple):  # layer widths: each of them, and at least one
            if not value:
                raise ValueError(f"{name} must name at least one width, got []")
            value, given = min(value), list(value)
        if value is not None and value < low:
            raise ValueError(f"{name} must be >= {low}, got {given}")


def positive(obj: Any, *names: str) -> None:
    """Like :func:`at_least`, for fields that must be > 0 (learning rates, coefficients)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def unit_interval(obj: Any, *names: str) -> None:
    """Like :func:`at_least`, for fields in [0, 1] (discounts, probabilities, Polyak rates)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")


def changed_keys(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two nested mappings: key -> (old, new).

    >>> changed_keys({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4})
    {'a.c': (2, 3), 'd': (None, 4)}
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return {} if old == new else {prefix: (old, new)}
    out: dict[str, tuple[Any, Any]] = {}
    for key in [*old, *(k for k in new if k not in old)]:
        out.update(changed_keys(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key)))
    return out


def to_dict(obj: Any) -> Any:
    """Dataclasses (nested) to plain YAML-serialisable data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


WIDTH_BYTES = 64
"""Bytes a layer width ``w`` costs at least per ``w * w``: a square float32 weight matrix, its gradient and
Adam's two moments (16 bytes a weight), in the four such layers of a two-hidden-layer actor-critic."""


def memory_bytes() -> int:
    """This machine's physical memory."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``format_bytes(3 * 2**30)`` is ``'3.00 GiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} PiB"


Widths = int | tuple[int, ...]
"""A graph's ``hidden``: one width, for two hidden layers of it, or each hidden layer's width in order
(``[400, 300]``, rl-zoo's ``net_arch``)."""


def widths(hidden: Widths) -> tuple[int, ...]:
    """Each hidden layer's width.

    >>> widths(64), widths([400, 300])
    ((64, 64), (400, 300))
    """
    return (hidden, hidden) if isinstance(hidden, int) else tuple(hidden)


MAX_LAYERS = 32
"""The most hidden layers ``hidden`` may name: deeper MLPs than this are a typo, not a network."""


def widths_fit(obj: Any, *names: str) -> None:
    """Refuse a layer width whose networks could not be allocated here (``hidden: 100000000``)."""

    ram = memory_bytes()
    for name in names:
        layers = widths(getattr(obj, name))
        if len(layers) > MAX_LAYERS:
            raise ValueError(f"{name} names {len(layers)} hidden layers; at most {MAX_LAYERS}")
        width = max(layers, default=0)
        need = WIDTH_BYTES * width * width
        if need > ram:
            raise ValueError(
                f"{name}: {width} makes networks of at least {format_bytes(need)} ({width} x {width} weights "
                f"per layer), more than this machine's {format_bytes(ram)}"
            )
