"""The unit tier: everything runs in the test process, the real stager in a thread
included (tests/support/stager_thread.py); no process of ours is started."""
