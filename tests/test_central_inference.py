"""Central batched inference: the batcher without Dask, then the policy on a real LocalCluster."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from dagrl.core.schema import ConfigError
from dagrl.policies import build_policy
from dagrl.policies.inference import StreamingCentralInference
from dagrl.runtime.inference import (
    Batcher,
    BatchServer,
    InferenceClient,
    InferenceError,
    InferenceUnavailable,
    decode,
    encode,
)
from tests.helpers import train

SEED = "graphs/ppo-cartpole-seed.yaml"
ASYNC = "policy={name: central-inference, asynchronous: true, max_staleness: 1, rollouts_per_update: 2}"
WHOLE = "roles.sampler.double_buffer=off"
"""Each sampler asks for all its envs' actions at once: the batches these tests count (a double-buffered
sampler asks per group of its envs: tests/test_double_buffer.py)."""


class Doubling:
    """An acting object that records each forward's batch."""

    def __init__(self):
        self.batches = []

    def __call__(self, obs):
        self.batches.append(obs.copy())
        return obs * 2, obs.sum(axis=1)


def _ask(batcher, requests, gaps_s=()):
    """Each request from a client thread of its own, through a real socket server; their answers."""
    server = BatchServer(batcher)
    answers = [None] * len(requests)

    def one(i, request):
        time.sleep(gaps_s[i] if i < len(gaps_s) else 0.0)
        client = InferenceClient(f"sampler[{i}]", timeout_s=10.0)
        client.attach(server.endpoint)
        try:
            answers[i] = client(*request) if isinstance(request, tuple) else client(request)
        except Exception as err:
            answers[i] = err

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    return answers


def test_one_forward_answers_every_sampler_with_its_own_rows():
    net = Doubling()
    batcher = Batcher(net, threading.RLock(), expected=3, max_wait_s=10.0)
    requests = [np.full((n, 2), i, np.float32) for i, n in enumerate([1, 3, 2])]
    answers = _ask(batcher, requests)
    assert len(net.batches) == 1 and net.batches[0].shape == (6, 2)  # no wait: all three asked
    for obs, (doubled, summed) in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(doubled, obs * 2)
        np.testing.assert_array_equal(summed, obs.sum(axis=1))
    stats = batcher.stats()
    assert stats["inference/forwards"] == 1 and stats["inference/batch_rows"] == 6
    assert stats["inference/batch_requests"] == 3


def test_a_request_of_several_arrays_is_batched_array_by_array():
    """A recurrent policy's samplers send their envs' states beside the observations (``ppo_lstm``):
    each array is concatenated with the same array of the other requests, and each answer cut back."""

    def step(obs, state):
        return obs.sum(axis=1), state + 1

    batcher = Batcher(step, threading.RLock(), expected=2, max_wait_s=10.0)
    requests = [(np.full((n, 3), i, np.float32), np.full((n, 4), 10 * i, np.float32)) for i, n in enumerate([2, 1])]
    answers = _ask(batcher, requests)
    for (obs, state), (summed, after) in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(summed, obs.sum(axis=1))
        np.testing.assert_array_equal(after, state + 1)
    assert batcher.stats()["inference/batch_rows"] == 3
    mixed = _ask(Batcher(step, threading.RLock(), expected=2, max_wait_s=10.0), [requests[0], requests[1][0]])
    assert all(isinstance(a, InferenceError) and "requests of [1, 2] arrays" in str(a) for a in mixed)


def test_a_missing_sampler_delays_the_batch_by_max_wait_only():
    net = Doubling()
    batcher = Batcher(net, threading.RLock(), expected=3, max_wait_s=0.05)
    requests = [np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)]
    answers = _ask(batcher, requests, gaps_s=[0.0, 0.01])  # the third sampler never asks
    assert [b.shape for b in net.batches] == [(4, 2)]
    np.testing.assert_array_equal(answers[0][0], 2 * np.ones((2, 2)))
    assert batcher.stats()["inference/queue_ms"] >= 30  # they waited for it, then went on


def test_a_failing_forward_fails_every_request_of_its_batch():
    def broken(obs):
        raise ValueError("bad weights")

    batcher = Batcher(broken, threading.RLock(), expected=2, max_wait_s=1.0)
    answers = _ask(batcher, [np.ones((1, 2)), np.ones((1, 2))])
    assert all(isinstance(a, InferenceError) and "raised ValueError: bad weights" in str(a) for a in answers)


def test_frames_carry_arrays_as_data_and_strangers_are_dropped():
    arrays = (np.arange(6, dtype=np.int64).reshape(2, 3), np.zeros((0, 4), np.float32), np.float32(2.5) * np.ones(3))
    body = encode(arrays)[4:]
    for got, want in zip(decode(body), arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert decode(encode(ValueError("no"))[4:]) == "ValueError: no"

    server = BatchServer(Batcher(Doubling(), threading.RLock(), expected=1, max_wait_s=0.0))
    host, port, token, tls = server.endpoint
    assert not tls  # not in a worker of a TLS cluster
    stranger = InferenceClient("stranger", timeout_s=5.0)
    stranger.attach((host, port, "00" * 16, False))  # the wrong token: the server hangs up
    with pytest.raises(InferenceUnavailable, match="stranger could not reach"):
        stranger(np.ones((1, 2), np.float32))
    sampler = InferenceClient("sampler[0]", timeout_s=5.0)
    sampler.attach(server.endpoint)
    np.testing.assert_array_equal(sampler(np.ones((1, 2), np.float32))[0], 2 * np.ones((1, 2)))
    server.close()


def _tls_pair():
    """Server and client contexts from one throwaway cluster certificate, as Dask's workers have them."""
    from distributed.security import Security

    sec = Security.temporary()
    return sec.get_listen_args("worker")["ssl_context"], sec.get_connection_args("worker")["ssl_context"]


def test_under_tls_samplers_are_answered_and_nobody_without_the_clusters_certificate_is():
    server_tls, client_tls = _tls_pair()
    net = Doubling()
    server = BatchServer(Batcher(net, threading.RLock(), expected=2, max_wait_s=10.0), tls=server_tls)
    host, port, token, tls = server.endpoint
    assert tls, "the endpoint tells samplers to speak TLS"

    answers = [None, None]

    def one(i):  # big enough to span many TLS records (16 KiB each)
        client = InferenceClient(f"sampler[{i}]", timeout_s=10.0, tls=client_tls)
        client.attach(server.endpoint)
        answers[i] = [client(np.full((64, 84 * 84), i + k, np.float32)) for k in range(3)]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i in range(2):
        for k, (doubled, _) in enumerate(answers[i]):
            np.testing.assert_array_equal(doubled, np.full((64, 84 * 84), 2 * (i + k), np.float32))
    assert [b.shape[0] for b in net.batches] == [128, 128, 128]  # both samplers in every forward

    _, other_tls = _tls_pair()  # TLS, but another cluster's certificate
    stranger = InferenceClient("stranger", timeout_s=5.0, tls=other_tls)
    stranger.attach(server.endpoint)
    with pytest.raises(InferenceUnavailable, match="stranger could not reach"):
        stranger(np.ones((1, 2), np.float32))
    plain = InferenceClient("plain", timeout_s=2.0)  # the right token, in the clear
    plain.attach((host, port, token, False))
    with pytest.raises(InferenceUnavailable, match="plain could not reach"):
        plain(np.ones((1, 2), np.float32))
    outside = InferenceClient("outside")  # told to speak TLS, but no worker of a TLS cluster
    outside.attach(server.endpoint)
    with pytest.raises(InferenceError, match="speaks TLS, but this process has no TLS context"):
        outside(np.ones((1, 2), np.float32))

    server.batcher.expected = 1  # one sampler left
    sampler = InferenceClient("sampler[0]", timeout_s=10.0, tls=client_tls)  # the server still answers
    sampler.attach(server.endpoint)
    np.testing.assert_array_equal(sampler(np.ones((2, 2), np.float32))[0], 2 * np.ones((2, 2)))
    assert not server.handshaking, "failed handshakes are dropped"
    server.close()


def test_a_sampler_whose_inference_role_is_gone_gets_one_clear_error():
    server = BatchServer(Batcher(Doubling(), threading.RLock(), expected=1, max_wait_s=0.0))
    client = InferenceClient("sampler[0]", timeout_s=5.0)
    client.attach(server.endpoint)
    assert client(np.ones((1, 2), np.float32))[0].shape == (1, 2)
    server.close()  # as when the inference worker dies: the connection and the socket close
    with pytest.raises(InferenceUnavailable, match=r"sampler\[0\] could not reach the inference role"):
        client(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceUnavailable, match="no inference role attached"):
        InferenceClient("sampler[1]")(np.ones((1, 2), np.float32))


def test_inference_is_started_only_under_central_inference():
    assert "inference" in load_graph(SEED).active_roles
    assert "inference" not in load_graph("graphs/ppo-cartpole-sync.yaml").active_roles


def test_an_algorithm_without_an_inference_role_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="inference") as err:
        load_graph("graphs/dqn-cartpole-single.yaml", ["policy=central-inference"])
    assert "policy" in str(err.value)


def test_stream_options_are_refused_without_asynchronous():
    with pytest.raises(ConfigError, match="max_staleness only apply with asynchronous: true") as err:
        load_graph(SEED, ["policy={name: central-inference, max_staleness: 2}"])
    assert "policy" in str(err.value)
    with pytest.raises(ConfigError, match="rollouts_per_update must be >= 1"):
        load_graph(SEED, ["policy={name: central-inference, asynchronous: true, rollouts_per_update: 0}"])


def test_asynchronous_samplers_stream_through_the_inference_role(client):
    """Rollouts arrive as under ``async`` (never staler than max_staleness, two per update), every
    action picked by the inference role, whose forwards batch rows of both samplers' envs."""
    graph = load_graph(SEED, [ASYNC, WHOLE])
    policy = build_policy(graph, client)
    assert isinstance(policy, StreamingCentralInference)
    try:
        results = [policy.step() for _ in range(8)]
    finally:
        policy.close()
    for r in results:
        # two rollouts of one sampler's 4 envs x 32 steps, and any dropped as too stale (still counted)
        assert r.env_steps >= 2 * 4 * 32 and r.env_steps % (4 * 32) == 0
        assert r.metrics["perf/staleness"] <= 1
        assert r.metrics["inference/forwards"] > 0 and r.metrics["inference/batch_rows"] >= 4
        assert r.metrics["inference/latency_ms"] > 0
    assert len({round(r.metrics["losses/value"], 6) for r in results}) > 1  # the learner did learn


def test_every_action_comes_from_the_weights_the_learner_published(client):
    """One gradient step per iteration on the whole batch: the ratio of the learner's policy to the
    behaviour log-probs the inference role recorded is exactly 1 before the step, so approx_kl is ~0
    every iteration, unless an action came from other weights (a previous version, or none loaded)."""
    graph = load_graph(
        SEED,
        ["hyperparameters.update_epochs=1", "hyperparameters.minibatch_size=256", "policy.max_wait_ms=10000", WHOLE],
    )
    policy = build_policy(graph, client)
    try:
        results = [policy.step() for _ in range(6)]
    finally:
        policy.close()
    for r in results:
        assert r.env_steps == 2 * 4 * 32
        assert abs(r.metrics["losses/approx_kl"]) < 1e-6 and r.metrics["losses/clipfrac"] == 0.0
        assert r.metrics["inference/forwards"] == 32  # one forward per env step for both samplers
        assert r.metrics["inference/batch_rows"] == 8 and r.metrics["inference/batch_requests"] == 2
        assert r.metrics["inference/latency_ms"] > 0
    # and the weights did change between iterations (the check above is not vacuous)
    assert len({round(r.metrics["losses/value"], 6) for r in results}) > 1


def test_double_buffered_samplers_act_with_the_published_weights_in_both_groups(client):
    """As above, each sampler's envs in two groups whose requests are out at once: still every action
    from the weights the learner published, and each forward answers a group (2 envs), not a sampler."""
    graph = load_graph(
        SEED,
        ["hyperparameters.update_epochs=1", "hyperparameters.minibatch_size=256", "policy.max_wait_ms=10000",
         "roles.sampler.double_buffer=on"],
    )  # fmt: skip
    policy = build_policy(graph, client)
    try:
        results = [policy.step() for _ in range(4)]
    finally:
        policy.close()
    for r in results:
        assert r.env_steps == 2 * 4 * 32
        assert abs(r.metrics["losses/approx_kl"]) < 1e-6 and r.metrics["losses/clipfrac"] == 0.0
        assert r.metrics["inference/forwards"] == 64  # two requests of 2 envs per sampler and step, 2 per forward
        assert r.metrics["inference/batch_rows"] == 4
    assert len({round(r.metrics["losses/value"], 6) for r in results}) > 1


@pytest.mark.slow
def test_central_inference_ppo_learns_cartpole(client, tmp_path):
    summary, rundir = train(SEED, tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return", summary
    rows = rundir.read_metrics()
    assert summary["stopped_at"]["mean_return"] >= 475  # rounds in flight at the stop count after it
    forwards = sum(r["inference/forwards"] for r in rows)
    assert forwards >= 32 * len(rows)  # every env step went through the inference role
    assert np.mean([r["inference/batch_requests"] for r in rows]) >= 1.5  # batched across samplers


@pytest.mark.slow
def test_seed_shaped_impala_learns_cartpole(client, tmp_path):
    """IMPALA with asynchronous central inference (graphs/impala-cartpole-seed.yaml): it learns only
    if the inference role takes the learner's new weights as they are published."""
    summary, rundir = train("graphs/impala-cartpole-seed.yaml", tmp_path, client=client)
    assert summary["stop_reason"] == "mean_return", summary
    rows = rundir.read_metrics()
    assert summary["stopped_at"]["mean_return"] >= 475  # rounds in flight at the stop count after it
    served = sum(r["inference/forwards"] * r["inference/batch_rows"] for r in rows)
    assert served >= 0.95 * rows[-1]["env_steps"]  # every env step was acted on by the inference role
    assert max(r["perf/staleness"] for r in rows) <= 8
