"""Sum and min trees over a fixed number of slots, updated and queried a whole batch at a time."""

from __future__ import annotations

import numpy as np


class PriorityTree:
    """Proportional-priority index (PER): prefix-sum sampling and the minimum priority, in O(log n).

    Examples
    --------
    >>> t = PriorityTree(4)
    >>> t.set(np.array([0, 1, 2, 3]), np.array([1.0, 0.0, 3.0, 0.0]))
    >>> t.total, t.min
    (4.0, 1.0)
    >>> t.find(np.array([0.5, 1.5, 3.9])).tolist()
    [0, 2, 2]
    """

    def __init__(self, slots: int):
        self.slots = slots
        self.size = 1 << max(0, (slots - 1).bit_length())
        self.sums = np.zeros(2 * self.size)
        self.mins = np.full(2 * self.size, np.inf)

    @property
    def total(self) -> float:
        return float(self.sums[1])  # node 1 is the root (and the only leaf when size is 1)

    @property
    def min(self) -> float:
        return float(self.mins[1])

    def leaves(self) -> np.ndarray:
        return self.sums[self.size : self.size + self.slots].copy()

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaf values (0 removes a slot from sampling); later duplicates win."""
        nodes = np.asarray(slots, np.int64) + self.size
        values = np.asarray(values, np.float64)
        self.sums[nodes] = values
        self.mins[nodes] = np.where(values > 0, values, np.inf)
        if not len(nodes) or self.size == 1:
            return
        nodes = np.unique(nodes) // 2  # sorted once: the parents of sorted nodes stay sorted
        keep = np.empty(len(nodes), bool)
        keep[0] = True
        while True:  # up a level at a time, each parent once (a sorted dedupe, not a sort per level)
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1 : len(nodes)])
            nodes = nodes[keep[: len(nodes)]]
            left = 2 * nodes
            self.sums[nodes] = self.sums[left] + self.sums[left + 1]
            self.mins[nodes] = np.minimum(self.mins[left], self.mins[left + 1])
            if nodes[0] == 1:
                break
            nodes //= 2

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(slots, np.int64) + self.size]

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each prefix sum in ``[0, total)``, the slot whose cumulative range holds it."""
        idx = np.ones(len(prefix), np.int64)
        prefix = np.asarray(prefix, np.float64).copy()
        while idx[0] < self.size:
            left = 2 * idx
            # rounding can leave a prefix past the left sum with nothing on the right: stay left
            go_right = (prefix >= self.sums[left]) & (self.sums[left + 1] > 0)
            prefix -= np.where(go_right, self.sums[left], 0.0)
            idx = left + go_right
        return np.minimum(idx - self.size, self.slots - 1)
