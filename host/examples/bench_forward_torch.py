"""PyTorch side of ci/bench-forward.sh: transformers loading the same GGUF
(dequantized to f32), one sequence of --seq tokens, full logits, best and
median tokens/s over --reps runs after a warm-up, and peak RSS."""
import argparse
import resource
import time

import torch
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
p.add_argument("--seq", type=int, default=256)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--dtype", default="float32")
a = p.parse_args()
torch.set_num_threads(a.threads)
folder, _, name = a.model.rpartition("/")
model = AutoModelForCausalLM.from_pretrained(folder or ".", gguf_file=name, dtype=getattr(torch, a.dtype)).eval()
vocab = model.config.vocab_size
ids = torch.tensor([[(i * 2654435761 + 17) % vocab for i in range(a.seq)]])
times = []
with torch.inference_mode():
    for _ in range(a.reps + 1):
        t = time.perf_counter()
        model(input_ids=ids).logits
        times.append(time.perf_counter() - t)
times = sorted(times[1:])
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"pytorch {torch.__version__} forward ({a.dtype}): seq {a.seq}, {a.threads} threads: "
      f"best {a.seq / times[0]:.0f} tok/s, median {a.seq / times[len(times) // 2]:.0f} tok/s, peak RSS {rss:.0f} MiB")
