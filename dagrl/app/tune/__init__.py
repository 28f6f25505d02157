"""``dagrl tune``: choose samplers, envs per sampler and the policy of a graph from measurements of
the machine, verified by short real runs (:mod:`.tuner`; the cost model: :mod:`.model`)."""

from dagrl.app.tune.measure import Measurements
from dagrl.app.tune.tuner import Tuning, shape_of, tune, write_tuned

__all__ = ["Measurements", "Tuning", "shape_of", "tune", "write_tuned"]
