"""Algorithms, one module each; none imports dask or the runtime."""
