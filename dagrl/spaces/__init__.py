"""What dagrl reads from an observation space, below the envs that make it and the networks that read
it: where an image lies in an observation (:mod:`.images`), and how one beside other values is packed
into one vector (:mod:`.mixed`).

Design notes
------------

Every algorithm's networks take a float vector or a ``uint8`` image, so envs are made through
``dagrl.envs.vector.make_env`` / ``make_vector``, which apply ``vector_observations`` to each env (as a gymnasium
wrapper, so it runs in the env's own process under ``vector: async``): a space that is not a ``Box`` goes through
gymnasium's ``FlattenObservation`` (``Discrete`` one-hot, ``Tuple`` and ``Dict`` concatenated), ``uint8`` images arrive
channels first (``dagrl/spaces/images.py``: ``[H, W, C]`` turned, a stack of frames ``[S, H, W, C]`` or `[S, C, H,
W]`` folded into ``S * C` channels, the oldest frame's first), and integer vectors other than images (an image
under the CNN's 36 pixels included) become ``float32``; float ``Box`` spaces and images pass untouched, so
existing runs, checkpoints and replay stores are unchanged. The graph check applies the same function to its
probe env, so the spaces the learner is built for are the samplers'. A space with no fixed size (``Sequence``,
``Graph``) is refused there, naming the space.

An env id the driver can make is not always one a worker can: ``ALE/Pong-v5`` exists in a process only after
``import ale_py``, and Dask's workers are fresh processes. Workers, ``dagrl tune``'s probes and exported policies
therefore get ``Graph.env_id`` (``dagrl.envs.vector.importable_env_id``). That is the id with the module that
registered it put in front (``ale_py.env:ALE/Pong-v5``), gymnasium's own form for "import this first". It is
used where that module is neither gymnasium nor ``__main__`` and the id names no module yet. The graph file, run
directory and logs keep the id as written.

A ``Dict`` (or ``Tuple``) with an image entry is the one exception to flattening as gymnasium does
(``dagrl/spaces/mixed.py``). ``MixedObservation`` packs it into one ``uint8`` vector. First come the other entries,
flattened, each value a ``float32`` written as its 4 bytes. Then each image, channels first (a stack of frames
folded into the channels, as for an image alone), a byte a pixel. Then zero bytes up to a multiple of 4, so
every row of a batch starts on a ``float32`` boundary. The space it gives, a ``MixedBox``, is still a flat ``Box``
to samplers, Dask, replay and checkpoints, and it records where each entry lies (its ``parts``, pickled with the
space to every worker). Pixels therefore cost one byte on the wire and in replay, as an image observation's
do. ``dagrl.nn.encoders.encoder`` gives a ``MixedBox`` a ``MixedEncoder``. It reads the entries' bytes back as
``float32`` with one ``view`` (bit for bit), gives each image part the graph's CNN, and concatenates all in the
``Dict``'s order. PPO's heads are then its MLPs and DQN's a hidden layer and its head. An algorithm that calls
``.float()`` on its observations (DQN's update, the samplers' acting) hands the encoder the same byte values as
floats; it turns them back to ``uint8`` exactly before reading them. PPO's and IMPALA's ``norm_obs`` standardises
the entries that are not images (``MixedEncoder.forward(obs, norm)``), and is refused for a ``Dict`` of images
only, as for an image. SAC's and TD3's ``augment_shift`` moves each image part of the vector (``networks.Shift``)
and keeps the other entries' bytes.

A graph's ``env.wrappers`` (``dagrl/envs/wrappers.py``) go between ``gymnasium.make`` and ``vector_observations``.
They travel to the workers as import paths and keyword arguments (``RoleContext.env_wrappers``), not as objects,
so a wrapper needs no pickling and every process imports it as it imports an env id's module; under `vector:
async`` they are one ``functools.partial`` in ``make_vec``'s ``wrappers` list, built inside each env's subprocess.
The graph check imports and builds them around its probe env, so the spaces it gives the learner are the
wrapped ones.
"""
