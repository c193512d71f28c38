"""Text to tokens: normalization per language, numbers in words, phonemes, the tokenizer
(encoder.py)."""
