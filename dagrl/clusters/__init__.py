"""Where a run's workers come from: a LocalCluster, a running scheduler, or SLURM."""
