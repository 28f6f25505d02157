"""n-step transitions, built per env on the sampler side before rows reach a replay store.

A store holds rows from many envs interleaved, so row ``i + 1`` is not the step after row ``i``;
n-step returns are therefore folded where the env order is still known: in the sampler.
"""

from __future__ import annotations

import collections

import numpy as np


class NStep:
    """Turns one-step transitions of ``num_envs`` envs into n-step ones.

    Each emitted row has ``reward = sum_k gamma^k r_k`` over up to ``n`` steps, the ``next_obs``
    after the last of them, ``terminated``/``truncated`` of that step and ``discount = gamma^m``
    (``m`` the steps folded), so a learner bootstraps with ``reward + discount * (1 - terminated) * V``.

    Examples
    --------
    >>> ns = NStep(n=2, gamma=0.5, num_envs=1)
    >>> step = lambda r, done: ns.push(np.zeros((1, 1)), np.zeros(1), np.array([r]), np.zeros((1, 1)),
    ...                               np.array([done]), np.array([False]))
    >>> len(step(1.0, False)["reward"])
    0
    >>> step(2.0, False)["reward"].tolist()
    [2.0]
    >>> step(4.0, True)["reward"].tolist()  # the episode ends: both pending rows come out
    [4.0, 4.0]
    """

    def __init__(self, n: int, gamma: float, num_envs: int):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n, self.gamma = n, gamma
        self.pending: list[collections.deque] = [collections.deque() for _ in range(num_envs)]

    def push(self, obs, action, reward, next_obs, terminated, truncated) -> dict[str, np.ndarray]:
        """Add one vector-env step; return the n-step rows completed by it (possibly none)."""
        rows = []
        for e, queue in enumerate(self.pending):
            queue.append((obs[e], action[e], float(reward[e])))
            done = bool(terminated[e] or truncated[e])
            while queue and (len(queue) == self.n or done):
                ret = sum(r * self.gamma**k for k, (_, _, r) in enumerate(queue))
                o, a, _ = queue.popleft()
                m = len(queue) + 1
                rows.append((o, a, ret, next_obs[e], bool(terminated[e]), bool(truncated[e]), self.gamma**m))
        if not rows:
            return {
                "obs": np.zeros((0, *np.shape(obs)[1:]), np.asarray(obs).dtype),
                "action": np.zeros((0, *np.shape(action)[1:]), np.asarray(action).dtype),
                "reward": np.zeros(0, np.float32),
                "next_obs": np.zeros((0, *np.shape(next_obs)[1:]), np.asarray(next_obs).dtype),
                "terminated": np.zeros(0, bool),
                "truncated": np.zeros(0, bool),
                "discount": np.zeros(0, np.float32),
            }
        o, a, r, no, te, tr, d = zip(*rows, strict=True)
        return {
            "obs": np.stack(o),
            "action": np.stack(a),
            "reward": np.asarray(r, np.float32),
            "next_obs": np.stack(no),
            "terminated": np.asarray(te),
            "truncated": np.asarray(tr),
            "discount": np.asarray(d, np.float32),
        }
