"""wheel's gRPC layer: the generated contract (``wheel.rpc.v1``) and the
conversion between its messages and the engine's values (``wheel.rpc.convert``)."""
