"""``dagrl tune``: choose samplers, envs per sampler and the policy of a graph from measurements of
the machine, verified by short real runs (:mod:`.tuner`; the cost model: :mod:`.model`).

Design notes
------------

``dagrl tune`` chooses how a graph is spread, never what it learns from: the env steps behind one learner update
(PPO's batch; DQN/SAC/TD3's steps between learner rounds, so their update-to-data ratio) and every
hyperparameter stay; the policy, ``roles.sampler.replicas``/``envs``/``vector``, the collect's length (off-policy
only) and ``rollouts_per_update``/``update_ratio`` change. Three parts:

* ``tune/measure.py``, run on one worker of the cluster being tuned: first the env alone, with random actions at
  1 env and at the most envs a candidate gives a sampler, on each vector env backend that can run it (``sync``,
  ``threads``, and ``envpool`` where EnvPool is installed and has the env's task with the same spaces), timing
  wall and CPU (the process's, less its idle rate, for ``threads`` and EnvPool's threads, whose share of a core
  can pass 1). On the lines through those points, at the graph's envs per sampler, the backend that took least
  is kept if it beats the graph's own by more than ``MARGIN`` (10 %), else the graph's stays
  (``tuner.choose_vector``), and every probe after this one runs on it. "Least" is CPU time when the graph has
  at least as many actors as the cluster has cores, else wall time: EnvPool's threads finish a vector step
  sooner on cores the samplers and learner would use anyway (Pong at 4 envs, stepped in one process here: 1.16
  ms of wall against gymnasium's 1.86 ms, but 2.03 ms of CPU against 1.86; in a worker during a tune, 1.60
  against 1.79 ms of CPU, so there EnvPool won by CPU too, by 10 %). Candidates still come on every backend
  measured: one on another backend than the probes' has a collect's seconds per vector step with the env's
  seconds swapped for that backend's (``Measurements.costs(..., vector)``: both as lines against envs, so
  EnvPool's lead growing with envs is priced per candidate), and that backend's CPU share; acting, the
  learner, the load slowdown and the calibration stay as measured on the probes' backend. Among settings
  within ``MARGIN`` of the fastest, as near the graph as written, its own backend wins. ``async`` is not tried,
  and a graph on ``async`` keeps it: its env processes take cores the model does not count, and their CPU is not
  the probe's to measure. Then the graph's own iteration under ``single`` with one sampler of 1 and of the most
  envs a candidate gives (the role hosts' ``busy_s`` per fragment: seconds per vector step, each learner role's
  seconds per update, with the graph's own networks, batch sizes and devices; off-policy probes learn from one
  batch on); the env alone stepped with random actions (wall and thread CPU time: a sleeping simulator leaves
  its core free); the sampler's collect, with its networks, on 2, 4, 8, 16 and every other worker at once in
  timed windows while one worker runs the iteration (how much a collect slows beside a learner and that many
  samplers; a local cluster started for the probes gets twice as many workers as cores, up to 17, so the
  windows reach the sampler counts candidates use); 20 no-op tasks (round trip; CPU of scheduler, worker and
  client per task); a 64 MiB block moved between two workers minus a 1-byte one (bandwidth; the whole move
  when a noisy hop swallows the difference); cores per distinct host; GPUs. Cores and GPUs are counted, but
  GPUs are not yet a dimension of the candidates.
* ``tune/model.py``, pure functions of the measurements (so a ranking can be reproduced from a saved
  ``--measurements`` file): candidates that keep the batch, and env steps/s for each: serial sums for
  ``single``/``sync``, the slower of sampler and learner rates for the streaming policies, samplers counted only
  as many as the rate limiter lets collect at once (``async`` lets ``2 x rollouts_per_update`` collects run ahead
  of the last finished update), a streaming round timed by its critical path (each fragment waits for the hop
  bringing its inputs and for its role's previous fragment, so hops overlap with other roles' work;
  ``split-learner``'s roles update at once), everything divided by CPU contention (samplers' core share, the
  learner roles, the scheduler's and driver's CPU for every task: collects, inserts, each fragment of a
  round).
* ``tune/tuner.py``: runs the graph as written (or, for a ``single`` graph, the best distributed candidate)
  through ``dagrl.train`` for a few seconds and keeps achieved over predicted as the calibration of every
  distributed prediction (saved with the measurements); ranks; runs the best ``--verify`` candidates, one per
  policy and sampler count, and the best ``single`` one (steady env steps/s: rows after the first update and the
  first third of the run); writes the fastest, where "fastest" means within ``MARGIN`` (10 %) of the top and,
  among those, nearest the graph as written (``distance``: log ratios of envs stepping at once and of collect
  length), then the least stale (``model.staleness``: rounds by which what a round learns from may trail the
  newest weights), in choosing which setting of a (policy, samplers) group to verify and which run to write.
  In one SAC tune, ``single`` 1 x 16 envs x 1 step was predicted 7 % faster than 1 x 1 env x 16 steps; chosen,
  it needed 12,800 env steps to the target where the graph's own shape needed 7,008. What the model leaves
  out, and the verification catches: sleep wake-up latency and event-loop load when more processes than cores
  share a machine, the staleness drops of ``async``, the driver's per-rollout bookkeeping. On dagrl's embedded
  LocalCluster (``pack_samplers``, the default) the candidates have at most as many samplers as the cores: more
  would run as those within (as many samplers as the cores, stepping the same envs), so they are not searched;
  the graph as written, if it asks for more, is verified as ``dagrl run`` starts it, packed.
  ``central-inference`` and ``dp-learners`` are not candidates yet (the first measured 0.55 x ``async`` at 16
  samplers here; the second needs devices for its learner replicas and changes nothing on one CPU learner), nor
  is ``vector: async``. When the backend changed, the graph as written is verified on its own backend and, as
  the calibration run, on the chosen one; its prediction is shown for the chosen backend only.
"""

from dagrl.app.tune.measure import Measurements
from dagrl.app.tune.tuner import Tuning, shape_of, tune, write_tuned

__all__ = ["Measurements", "Tuning", "shape_of", "tune", "write_tuned"]
