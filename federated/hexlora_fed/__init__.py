"""Stage 1 of hexlora's hypernetwork, federated on Flower.

- `hypernet_io`: a hypernetwork directory <-> Flower ArrayRecord;
- `hexlora_cli`: the `hexlora hypertrain` invocations (worker round, init, held-out loss);
- `client_app`: a SuperNode's worker: one shard of users, N steps a round;
- `server_app`: FedAvg weighted by examples, a committed directory per round, resume.
"""
