"""Batches: one agent over many items, on threads or a Dask cluster, with shared limits."""
