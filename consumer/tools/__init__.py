"""Read-only tools: the ring inspector and its stall diagnosis."""
