"""The corpus: what it holds, read once into an index every process maps.

- entry.py: one clip (Entry), an unusable line (BadLine), CorpusError.
- format.py, registry.py, formats/: one module per corpus format, each with the
  same small face (find the corpus, stamp it, scan it, parse one line), registered
  by name; nothing outside them depends on the format.
- index.py: the CorpusIndex face and the index the builder made (build.py), mapped
  from its file (index_file.py) or held in memory; open.py opens the current one.
- lengths.py: each item's lengths in the index, for length buckets.
- members.py, object_store.py: a clip's bytes inside a tar shard, local or remote.
"""
