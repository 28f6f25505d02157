"""Where a run's workers come from: a LocalCluster, a running scheduler, or SLURM.

Design notes
------------

``dagrl.clusters.connect.connect`` dispatches on ``kind``: ``local`` starts a LocalCluster of worker processes, one
per role replica, Dask's per-worker profiler off (it cost samplers 15-20 %), Dask's periodic housekeeping at
calmer intervals (``quiet``: event-loop tick 1 s, system monitor 2 s, memory monitor 0.5 s, work stealing off;
an idle 9-worker cluster took 0.26 cores with Dask's defaults, 0.05 with these; and messages serialized on the
event loop instead of each being sized first for Dask's offload thread, which Dask reads only as it is
imported, so workers get it in their environment; SLURM worker jobs and the scheduler get the same settings)
and Ctrl-C ignored by the workers (the driver handles it: finish the iteration, checkpoint, stop; twice
aborts); ``scheduler`` attaches to a running cluster and leaves it running; ``slurm`` (``dagrl/clusters/slurm.py``)
starts a Dask scheduler in the driver's process and one dask-jobqueue ``SLURMJob`` per role replica. Pools are
extra entries of the SLURMCluster's ``worker_spec`` (it is a SpecCluster), one job shape per pool; each pool's
workers advertise ``pool-<name>=1`` (and ``GPU=N``), and each role is given its pool's resource, so the ordinary
placement keeps it there. ``desktop-gpu`` adds one worker per GPU to a LocalCluster the same way, each with
``CUDA_VISIBLE_DEVICES`` pinned and a thread for each GPU role it may host (``ceil(GPU role replicas / GPUs)``):
roles sharing a GPU (``GPU: 0.5`` each, such as ``split-learner``'s critic and actor on one card) run their
fragments at the same time, where one thread ran them one after the other.

Every dagrl worker, local or SLURM, starts without the ``MALLOC_TRIM_THRESHOLD_=65536`` that Dask's nanny sets
by default: with it glibc stops adapting its mmap threshold, and torch's larger allocations went to the system
each time (a SAC update took ~2 x as long). Locally ``clusters.untrimmed()`` sets the nanny config (and drops
the variable a plain LocalCluster of the same process left in ``os.environ``); SLURM job scripts export the
config with the variable set to None, which the nanny leaves out. A run on a cluster the user started warns
when its workers carry the variable (``clusters.trim_warning``).

``dagrl submit`` (``dagrl/clusters/submit.py``) runs the driver itself as a SLURM job, so training outlives the
shell on the login node. Before anything is queued, every script goes through ``sbatch --test-only``; a refusal
comes back as SLURM's own words on one line. The run directory is the only shared state: ``submit.json`` (driver
job id, login host), ``cluster.json`` (scheduler, dashboard port, node, worker job ids), ``actors.json``,
``jobs/*.sh`` (every script submitted), ``logs/``, ``tls/`` (per-run certificate, mode 0600). ``status`` reads those
plus ``squeue``/``scontrol``; ``cancel`` cancels the driver first (so it cannot submit more), then every job named
``dagrl-<run>-*``.
"""
