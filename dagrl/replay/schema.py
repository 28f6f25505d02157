"""The declared shape of a replay store's rows: named arrays, each with a dtype and a per-row shape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


class ReplayError(ValueError):
    """A replay store was used wrongly (bad batch, bad sample size) or its storage failed."""


@dataclass(frozen=True)
class Field:
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * np.prod(self.shape, dtype=np.int64))


class Schema(Mapping[str, Field]):
    """Ordered named fields of one row.

    Examples
    --------
    >>> s = Schema({"obs": ("float32", (4,)), "reward": ("float32", ())})
    >>> s.row_bytes
    20
    >>> s.validate({"obs": np.zeros((2, 4), np.float32), "reward": np.zeros(2)})
    Traceback (most recent call last):
    ...
    dagrl.replay.schema.ReplayError: field reward: expected dtype float32, got float64
    """

    def __init__(self, fields: Mapping[str, Any]):
        self._fields: dict[str, Field] = {}
        for name, spec in fields.items():
            if isinstance(spec, Field):
                self._fields[name] = spec
            else:
                dtype, shape = spec
                self._fields[name] = Field(np.dtype(dtype), tuple(int(d) for d in shape))
        if not self._fields:
            raise ReplayError("a schema needs at least one field")
        self._row_bytes = sum(f.row_bytes for f in self._fields.values())  # asked for on every cold read

    @classmethod
    def transitions(cls, observation_space: Any, action_space: Any, n_step: int = 1, **extras: Any) -> Schema:
        """obs, action, reward, next_obs, terminated, truncated for gymnasium spaces, plus extras; rows
        folding ``n_step`` > 1 steps of reward also carry the ``discount`` to bootstrap with
        (:class:`dagrl.replay.record.Recorder`)."""
        obs = (observation_space.dtype, observation_space.shape)
        if n_step > 1:
            extras = {"discount": ("float32", ()), **extras}  # gamma ** steps the row folds
        return cls(
            {
                "obs": obs,
                "action": (action_space.dtype, action_space.shape),
                "reward": ("float32", ()),
                "next_obs": obs,
                "terminated": ("bool", ()),
                "truncated": ("bool", ()),
                **extras,
            }
        )

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self._fields == other._fields

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {f.dtype}{list(f.shape)}" for k, f in self._fields.items())
        return f"Schema({inner})"

    @property
    def row_bytes(self) -> int:
        return self._row_bytes

    def validate(self, batch: Mapping[str, Any]) -> int:
        """Check a batch's keys, dtypes and shapes; return its number of rows."""
        missing = [k for k in self._fields if k not in batch]
        extra = [k for k in batch if k not in self._fields]
        if missing or extra:
            raise ReplayError(
                f"batch fields differ from the schema: missing {missing}, unexpected {extra} "
                f"(expected {list(self._fields)})"
            )
        rows = None
        for name, field in self._fields.items():
            value = batch[name]
            if not isinstance(value, np.ndarray):
                raise ReplayError(f"field {name}: expected a numpy array, got {type(value).__name__}")
            if value.dtype != field.dtype:
                raise ReplayError(f"field {name}: expected dtype {field.dtype}, got {value.dtype}")
            if value.shape[1:] != field.shape:
                raise ReplayError(
                    f"field {name}: expected shape (N, {', '.join(map(str, field.shape))}), got {value.shape}"
                )
            if rows is None:
                rows = value.shape[0]
            elif value.shape[0] != rows:
                raise ReplayError(f"field {name}: {value.shape[0]} rows, but other fields have {rows}")
        return int(rows or 0)

    def to_json(self) -> dict[str, Any]:
        return {k: {"dtype": f.dtype.str, "shape": list(f.shape)} for k, f in self._fields.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schema:
        return cls({k: (np.dtype(v["dtype"]), tuple(v["shape"])) for k, v in data.items()})
