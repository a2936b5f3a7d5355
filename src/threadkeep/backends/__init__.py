"""Storage backends: each turns the shared programs' requests into driver calls."""
