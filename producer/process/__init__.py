"""The producer as a process: its pool (or Ray actors), its loop over grants, its side
of the protocol with the stager, the writer of its samples into their places, and the
bounds on one sample's work. What a sample is made of lives beside it: text/, audio/,
features/, and the chain of stages in producer/pipeline.py."""
