"""What the tests share: one module per concern (starting runs, configs, audio files,
corpora, played peers, checks on delivered rows, waiting). No test module imports
another; they import from here."""
