"""The process tier: real processes (the stager, producers, a trainer, the launcher,
`ringfeed` commands, an S3 server, a fresh interpreter).

Each contract of docs/design.md#contracts keeps tests here with real producers:
1 and 3, test_transport_e2e (a producer SIGKILLed mid-write), test_reliability;
2, test_faults (a lossy link), test_stopped_producers; 4, test_trainer_e2e (a resumed
run), test_workers, test_balance; 5, test_buckets; 6, test_transport_e2e (SIGTERM, a
stager SIGKILLed and restarted), test_ring, test_failures_propagate; 7, test_trust (a
pool in another PID namespace), test_stopped_producers; 8, test_one_consumer,
test_remote_producers, test_hostile_messages (fuzzed frames); 9, test_faults (poison
items), test_tts_e2e, test_bad_references, test_causes_e2e, test_outliers_e2e; 10,
test_lying_peers; 11, test_speakers_e2e.
"""
