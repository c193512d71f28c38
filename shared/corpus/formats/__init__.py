"""One module per corpus format, each registered by name in shared/corpus/registry.py."""
