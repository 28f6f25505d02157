"""Values leaving a role host: tensors cross Dask on the CPU, checkpoints hold CPU tensors only.

The CUDA cases run where a GPU is (``pytest tests/test_wire.py`` on a GPU machine); on CPU-only
machines they are skipped and the CPU half still checks that dagrl's serializer is the one Dask uses.
"""

from __future__ import annotations

import pytest
import torch
from distributed.protocol.serialize import dask_serialize, deserialize, serialize

from dagrl.core.context import RoleContext
from dagrl.runtime.host import RoleHost
from dagrl.runtime.wire import to_cpu


def learner_context(seed: int) -> RoleContext:
    return RoleContext("learner", 0, 1, seed, "CartPole-v1").with_spaces()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_dagrl_tensor_serializer_is_registered_and_round_trips():
    assert dask_serialize.dispatch(torch.Tensor).__module__ == "dagrl.runtime.wire"
    value = {"w": torch.arange(6.0).reshape(2, 3), "p": torch.nn.Parameter(torch.ones(2)), "n": 3}
    back = deserialize(*serialize(value, serializers=["dask", "pickle"]))
    assert torch.equal(back["w"], value["w"]) and torch.equal(back["p"], value["p"]) and back["n"] == 3


def test_to_cpu_keeps_structure_and_values():
    value = {"a": [torch.ones(2), (torch.zeros(1), 5)], "b": "text"}
    out = to_cpu(value)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple) and out["a"][1][1] == 5
    assert torch.equal(out["a"][0], torch.ones(2)) and out["b"] == "text"


@cuda
def test_cuda_tensor_crosses_dask_on_the_cpu():
    t = torch.arange(4.0, device="cuda")
    back = deserialize(*serialize({"t": t}, serializers=["dask", "pickle"]))["t"]
    assert back.device.type == "cpu" and torch.equal(back, t.cpu())


@cuda
def test_gpu_learner_checkpoint_holds_cpu_tensors_and_loads_back():
    from dagrl.algos.common.actor_critic import Config

    host = RoleHost("ppo", "learner", learner_context(seed=0), Config(), wants_gpu=True)
    assert host.device == "cuda"
    sd = host.state_dict()
    tensors = [v for v in sd["agent"].values()]
    assert tensors and all(v.device.type == "cpu" for v in tensors)
    other = RoleHost("ppo", "learner", learner_context(seed=1), Config())
    other.load_state_dict(sd)  # a GPU run's checkpoint resumes on a CPU-only machine
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict()["agent"].values(), tensors, strict=True))
