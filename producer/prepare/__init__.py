"""Corpus preparation: everything a run reads about its corpus, written once."""
