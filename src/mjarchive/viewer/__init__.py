"""The browser viewer: what to draw for a model's geoms, and a bounded, prefetching window of poses."""
