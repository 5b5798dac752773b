"""The server's aggregation: Flower's FedAvg or FedAdam, optionally behind
Flower's client-side fixed-clipping DP wrapper, each made to fit rounds
that are commits.

- Every strategy keeps what a round's replies said (`last`, for
  round.json) and refuses to commit a round no worker answered: the
  federation stops, and started again it retries that round.
- FedAdam's server moments are part of a round's commit
  (`server-opt.safetensors`) and its bias correction counts rounds of the
  whole federation, so a resumed run takes the same steps as an
  uninterrupted one.
- DP: each worker's update is clipped to `clipping_norm` on the worker
  (`optional_clipping_mod` in the ClientApp) before it leaves the node;
  the server averages the clipped updates uniformly (the Gaussian
  mechanism's noise, noise_multiplier * clipping_norm / workers, assumes
  every worker weighs 1/workers) and adds the noise. Flower's wrapper adds
  the noise to the strategy's output, which is the average only for
  FedAvg, so DP is refused with FedAdam.
"""

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAdam, FedAvg
from safetensors.numpy import load_file, save_file

# The reply metric FedAvg weighs by: examples, or 1 per worker under DP.
BY_EXAMPLES, BY_WORKER = "num-examples", "unit-weight"
SERVER_OPT_FILE = "server-opt.safetensors"


class Recorded:
    """Mixed into a Flower strategy: records the round's replies and fails
    a round without parameters."""

    last: dict
    sent: list

    def configure_train(self, *args, **kwargs):
        """The round's instructions, remembering which nodes they go to (an
        error reply for an unreachable node does not carry its id)."""
        messages = list(super().configure_train(*args, **kwargs))
        self.sent = sorted(int(m.metadata.dst_node_id) for m in messages)
        return messages

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        ok = [m for m in replies if not m.has_error()]
        if arrays is None or not ok:
            raise RuntimeError(f"round {server_round}: no worker returned parameters ({len(replies) - len(ok)} failed)")
        def shard(m) -> str:
            mm = m.content["metrics"]
            return f'{int(mm["shard-k"])}/{int(mm["shard-of"])}' if "shard-k" in mm else "?"

        self.last = {
            "workers": len(ok),
            "failed": len(replies) - len(ok),
            # Which nodes this round had: the shard and Flower node id of
            # each worker that answered, and the ids of those that failed.
            "shards": sorted(shard(m) for m in ok),
            "nodes": sorted(int(m.metadata.src_node_id) for m in ok),
            "failed_nodes": sorted(set(getattr(self, "sent", [])) - {int(m.metadata.src_node_id) for m in ok}),
            "examples": sum(int(m.content["metrics"]["num-examples"]) for m in ok),
            "train_loss": float(metrics["train-loss"]) if metrics is not None else None,
        }
        return arrays, metrics


class RoundFedAvg(Recorded, FedAvg):
    """FedAvg, weighted by `weighted_by_key`."""

    def moments(self) -> dict[str, np.ndarray]:
        return {}


class RoundFedAdam(Recorded, FedAdam):
    """FedAdam (Reddi et al. 2020) whose rounds are numbered in the whole
    federation (`round_offset` committed rounds before this `flwr run`) and
    whose moments start from the last commit's."""

    def __init__(self, *, round_offset: int, moments: dict[str, np.ndarray], **kwargs):
        super().__init__(**kwargs)
        self.round_offset = round_offset
        if moments:
            self.m_t = {k[len("m/") :]: v for k, v in moments.items() if k.startswith("m/")}
            self.v_t = {k[len("v/") :]: v for k, v in moments.items() if k.startswith("v/")}

    def aggregate_train(self, server_round: int, replies):
        arrays, metrics = super().aggregate_train(self.round_offset + server_round, replies)
        # Flower's step multiplies by a float64 scalar, which NumPy 2
        # promotes the result to; the hypernetwork stays in its own dtype.
        dtypes = {k: v.dtype for k, v in self.current_arrays.items()}
        return ArrayRecord({k: Array(a.numpy().astype(dtypes[k])) for k, a in arrays.items()}), metrics

    def moments(self) -> dict[str, np.ndarray]:
        """The moments to commit with the round (`m/NAME`, `v/NAME`)."""
        if not self.m_t or not self.v_t:
            return {}
        return {**{f"m/{k}": np.ascontiguousarray(v) for k, v in self.m_t.items()}, **{f"v/{k}": np.ascontiguousarray(v) for k, v in self.v_t.items()}}


class RoundDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping DP around a Recorded FedAvg.
    Flower's wrapper skips aggregation when any worker failed (the noise
    is calibrated to the sampled count); here that ends the run, so the
    round is retried when the federation is started again."""

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            failed = sum(1 for m in replies if m.has_error())
            raise RuntimeError(
                f"round {server_round}: DP aggregation needs all {self.num_sampled_clients} workers' updates, "
                f"got {len(replies) - failed} ({failed} failed); start the federation again to retry the round"
            )
        self.last = self.strategy.last
        return arrays, metrics

    def moments(self) -> dict[str, np.ndarray]:
        return self.strategy.moments()


def check(strategy: str, dp_noise_multiplier: float, dp_clipping_norm: float) -> None:
    """Refuses run configs the strategies cannot honour (before round 0)."""
    if strategy not in ("fedavg", "fedadam"):
        raise ValueError(f"run config 'strategy' is {strategy!r}: use \"fedavg\" or \"fedadam\"")
    if dp_noise_multiplier > 0 and dp_clipping_norm == 0:
        raise ValueError("run config 'dp-noise-multiplier' > 0 needs 'dp-clipping-norm' > 0 (the noise is calibrated to the clipping norm)")
    if dp_clipping_norm > 0 and strategy != "fedavg":
        raise ValueError(
            "run config 'dp-clipping-norm' > 0 needs strategy=\"fedavg\" (Flower's DP wrapper adds its noise "
            "to the strategy's output, which is the clipped updates' average only for FedAvg)"
        )


def make_strategy(cfg, done: int, moments: dict[str, np.ndarray]):
    """The strategy `cfg` (a ServerConfig, passed by `check`) names,
    continuing after `done` committed rounds with FedAdam `moments` (empty
    at the start)."""
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=cfg.min_nodes, min_available_nodes=cfg.min_nodes)
    dp = cfg.dp_clipping_norm > 0
    if cfg.strategy == "fedadam":
        inner = RoundFedAdam(
            **common, round_offset=done, moments=moments, eta=cfg.server_lr, beta_1=cfg.server_beta1, beta_2=cfg.server_beta2, tau=cfg.server_tau
        )
    else:
        inner = RoundFedAvg(**common, weighted_by_key=BY_WORKER if dp else BY_EXAMPLES)
    if not dp:
        return inner
    return RoundDP(inner, noise_multiplier=cfg.dp_noise_multiplier, clipping_norm=cfg.dp_clipping_norm, num_sampled_clients=cfg.min_nodes)


def save_moments(directory: Path, moments: dict[str, np.ndarray]) -> None:
    """Writes the server optimizer's state into a round directory (before
    the round is renamed into place)."""
    if moments:
        save_file(moments, str(Path(directory) / SERVER_OPT_FILE))


def load_moments(directory: Path, strategy: str, round_: int) -> dict[str, np.ndarray]:
    """The server optimizer state committed with round `round_`: empty for
    FedAvg and at round 0; a FedAdam resume of a round without it fails."""
    path = Path(directory) / SERVER_OPT_FILE
    if strategy != "fedadam" or round_ == 0:
        return {}
    if not path.exists():
        raise ValueError(
            f"{path} is missing: round {round_} was not committed by FedAdam; resume with the strategy "
            "the federation ran with, or start a new out-dir"
        )
    return load_file(str(path))

