"""A hypernetwork directory (`hypernet.json` + `hypernet.safetensors`, as
`hexlora hypertrain` writes `hypernet/` and `hexlora synth` reads it) to and
from a Flower ArrayRecord.

The tensors travel under their safetensors names, as f32: FedAvg averages
them name by name, and a worker writes them back bit for bit. The only
copies are safetensors' read and Flower's own serialisation of each Array.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord
from safetensors.numpy import load_file, save_file

CONFIG_FILE = "hypernet.json"
WEIGHTS_FILE = "hypernet.safetensors"


def read_hypernet(directory: Path) -> tuple[ArrayRecord, str]:
    """The parameters of a hypernetwork directory and its configuration text."""
    weights = Path(directory) / WEIGHTS_FILE
    config = (Path(directory) / CONFIG_FILE).read_text()
    json.loads(config)  # a broken configuration fails here, naming the file below
    tensors = load_file(str(weights))
    for name, t in tensors.items():
        if t.dtype != np.float32:
            raise ValueError(f"{weights}: tensor {name} is {t.dtype}; federated rounds exchange f32 (write the network with --weights-dtype f32)")
    return ArrayRecord({name: Array(t) for name, t in tensors.items()}), config


def write_hypernet(directory: Path, arrays: ArrayRecord, config: str) -> None:
    """Writes `arrays` and `config` as a hypernetwork directory, replacing
    it whole: the files go to a sibling temporary directory renamed into
    place, so a reader never sees half a network."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {}
    for name, a in arrays.items():
        t = a.numpy()
        if t.dtype != np.float32:
            raise ValueError(f"array {name} is {t.dtype}, a hypernetwork is f32")
        tensors[name] = np.ascontiguousarray(t)
    save_file(tensors, str(tmp / WEIGHTS_FILE))
    (tmp / CONFIG_FILE).write_text(config)
    for f in (WEIGHTS_FILE, CONFIG_FILE):
        _fsync(tmp / f, os.O_RDONLY)
    _fsync(tmp, os.O_RDONLY)
    if directory.exists():
        shutil.rmtree(directory)
    os.rename(tmp, directory)
    _fsync(directory.parent, os.O_RDONLY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
