"""The docs tier: the pages are true (docs/development.md#this-site)."""
