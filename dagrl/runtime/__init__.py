"""Role hosts, actors, the driver loop, checkpoints and run directories."""
