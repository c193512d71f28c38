"""What a sample holds besides its tokens: the log-mel, pitch and energy, the user's fields,
reference clips, durations, and the feature cache that keeps them."""
