"""The data process: plan, slots, leases, batches (GPU:0 when it computes mels)."""
