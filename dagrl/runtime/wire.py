"""How values look when they leave a role host: to Dask's memory accounting and on the wire.

Importing this module registers both rules with Dask (the role host imports it):

* Fragment outputs are dataclasses of arrays (a ``Rollout``). Dask's ``sizeof`` sees only the object
  header (56 bytes), which misleads its memory accounting, spilling and transfer logs: count the fields.
* A torch tensor crosses Dask on the CPU. Dask's own torch serializer calls ``tensor.numpy()``, which
  fails for a CUDA tensor, so a learner on a GPU could not hand back a metric, a batch or its
  checkpoint. The receiving side moves what it gets to its own device (``load_state_dict`` and
  ``torch.as_tensor(..., device=)`` do), so nothing on the wire depends on where it was made.
  Checkpoints go further (:func:`to_cpu`): a run trained on a GPU resumes on a laptop.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

__all__ = ["to_cpu"]


def to_cpu(value: Any) -> Any:
    """``value`` with every torch tensor inside (dicts, lists, tuples) moved to the CPU; the rest as is.

    Examples
    --------
    >>> import torch
    >>> to_cpu({"w": torch.ones(2), "step": 3, "moments": [torch.zeros(1)]})["moments"][0].device.type
    'cpu'
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return type(value)((k, to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_cpu(v) for v in value)
    return value


def _register_sizeof() -> None:
    from dask.sizeof import sizeof

    @sizeof.register(object)
    def _sizeof(obj: Any) -> int:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return sys.getsizeof(obj) + sum(sizeof(getattr(obj, f.name)) for f in dataclasses.fields(obj))
        return sys.getsizeof(obj)


def _register_tensor_serializer() -> None:
    import torch
    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    # Dask registers its torch serializers lazily, at the first tensor it meets; run that now so
    # that ours, registered after, is the one used.
    serialize_cpu = dask_serialize.dispatch(torch.Tensor)
    dask_deserialize.dispatch(torch.Tensor)

    @dask_serialize.register(torch.Tensor)
    def _serialize(t: torch.Tensor) -> tuple[dict, list]:
        return serialize_cpu(t.detach().cpu() if t.device.type != "cpu" else t)


_register_sizeof()
_register_tensor_serializer()
