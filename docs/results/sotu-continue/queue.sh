#!/usr/bin/env bash
# sotu-continue on the full test split: base, common LoRA, per-user LoRA, ICL (k=1), model-free floors.
set -u
cd /work/main
B=/work/runs/lead/hexlora-bin; M=models/SmolLM2-135M-Instruct.Q4_1.gguf; R=/work/runs/lead/sotu
S="--bench /tmp/bb/sotu-continue --split test --model $M --max-new-tokens 128 --max-prompt-chars 1200 --max-len 256 --icl-k 1 \
   --rank 8 --alpha 16 --common-steps 60 --common-lr 1e-3 --user-steps 4 --user-lr 1e-3 --temperature 0 \
   --out $R/results --work-dir $R"
run() { echo "== $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): $*"; RAYON_NUM_THREADS=1 /usr/bin/time -v "$@" 2>&1 | grep -E "Elapsed|Maximum resident|User time|System time|error|Error" ; echo "== end $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"; }
for b in majority-user nearest-profile; do run $B eval --bench /tmp/bb/sotu-continue --split test --method $b --out $R/results; done
run $B eval $S --method base
run $B eval $S --method common-lora
run $B eval $S --method user-lora --common-adapter $R/common-lora/adapter
run $B eval $S --method icl
run $B report $R/results/*.json --baseline common-lora --metrics common-lora=$R/common-lora/metrics.jsonl --out $R/report
