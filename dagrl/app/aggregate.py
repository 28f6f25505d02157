"""Returns summarised over seeds as Agarwal et al. recommend ("Deep Reinforcement Learning at the Edge
of the Statistical Precipice", NeurIPS 2021): the interquartile mean and a bootstrap confidence
interval, not only a mean and a standard deviation.

* The **IQM** is the mean of the middle half of the runs: one seed that collapsed or one that was lucky
  moves it less than the mean, and it is less noisy than the median.
* The **interval** is a percentile bootstrap over the runs: resample them with replacement, take the
  statistic each time, read its 2.5 and 97.5 percentiles. With a handful of seeds it is wide, as it
  should be: it says how little five runs pin down.

Their library, ``rliable``, computes these over many tasks at once (a stratified bootstrap); one
setting's seeds need only the few numpy lines here, so dagrl does not depend on it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bootstrap_interval", "iqm"]


def iqm(x: np.ndarray | list[float]) -> np.ndarray | float:
    """The interquartile mean along the last axis: ``int(n / 4)`` values cut from each end of the sorted
    runs (as ``scipy.stats.trim_mean(x, 0.25)``), the rest averaged; for fewer than 4 runs, the mean.

    Examples
    --------
    >>> iqm([1.0, 2.0, 3.0, 4.0, 100.0])  # 1 cut from each end
    3.0
    >>> iqm([[1.0, 2.0, 3.0, 40.0], [0.0, 0.0, 1.0, 1.0]]).tolist()
    [2.5, 0.5]
    """
    a = np.sort(np.asarray(x, dtype=np.float64), axis=-1)
    n = a.shape[-1]
    if n == 0:
        raise ValueError("iqm of no runs")
    k = int(0.25 * n)
    out = a[..., k : n - k].mean(axis=-1)
    return float(out) if out.ndim == 0 else out


def bootstrap_interval(
    x: np.ndarray | list[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """The percentile-bootstrap ``level`` interval of the IQM of runs ``x``; ``None`` for fewer than 2
    runs. Seeded: the same runs give the same interval (a table read twice does not change).

    Examples
    --------
    >>> lo, hi = bootstrap_interval([480.0, 500.0, 500.0, 310.0, 495.0])
    >>> bool(310.0 <= lo < iqm([480.0, 500.0, 500.0, 310.0, 495.0]) < hi <= 500.0)
    True
    """
    runs = np.asarray(x, dtype=np.float64)
    if runs.ndim != 1:
        raise ValueError(f"runs must be one value per run, got shape {runs.shape}")
    if len(runs) < 2:
        return None
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    draws = np.random.default_rng(seed).integers(0, len(runs), size=(resamples, len(runs)))
    lo, hi = np.quantile(iqm(runs[draws]), [(1.0 - level) / 2, (1.0 + level) / 2])
    return float(lo), float(hi)
