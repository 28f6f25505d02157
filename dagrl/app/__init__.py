"""The application layer: the CLI, training and its driver, sweeps, tuning, export, eval, inspect."""
