"""Metrics: TensorBoard writer (one per role process on rank 0, a null one elsewhere) and aggregation."""
