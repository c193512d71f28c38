"""Audio: a clip decoded, mixed to mono, resampled, judged and normalized (decode.py);
containers whose sample data is cut short (containers.py)."""
