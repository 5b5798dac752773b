"""PyTorch + PEFT side of ci/bench-train.sh: LoRA training throughput and
peak RSS on the same model, data, threads and LoRA setup as hexlora.

    bench_train_pytorch.py MODEL.gguf DATA.jsonl STEPS THREADS DTYPE

Prints one line: `pytorch DTYPE tok/s: X peak RSS MiB: Y` (the first step is
warm-up and not timed, as on the hexlora side).
"""
import json
import resource
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

gguf, data, steps, threads, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
torch.manual_seed(0)
path = Path(gguf)
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=getattr(torch, dtype))
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4, weight_decay=0.0)
rows = [json.loads(l)["input_ids"] for l in Path(data).read_text().splitlines() if l.strip()]
tokens, seconds = 0, 0.0
for step in range(steps):
    ids = torch.tensor([rows[step % len(rows)]])
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    opt.zero_grad()
    if step > 0:
        seconds += time.perf_counter() - t0
        tokens += ids.numel()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"pytorch {dtype} tok/s: {tokens / seconds:.1f} peak RSS MiB: {rss:.0f} (last loss {loss.item():.4f})")
