"""Generated protobuf modules for the Lance / MemWAL on-storage format.

GENERATED CODE -- DO NOT EDIT. Sources: ``proto/*.proto``.
Rebuild with ``python proto/build.py`` (needs ``grpcio-tools``); the test
``tests/test_proto_generated.py`` checks these files are up to date.
"""
