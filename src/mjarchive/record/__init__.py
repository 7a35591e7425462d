"""Recording from a training loop: recorders that turn simulator state into archive frames at the render cadence."""
