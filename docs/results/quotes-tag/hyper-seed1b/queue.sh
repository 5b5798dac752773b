# The session's env.sh and queue scripts q1-q5, concatenated as a record (each was run
# on its own with `bash qN.sh`; this file is not meant to run as one).
# Measurement environment for issue 23 runs (recreated 2026-12-04 afternoon session).
cd /work/main
export RAYON_NUM_THREADS=2
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
R=/work/runs/eval/quotes-tag
H=/work/bin/hexlora
Q="--bench /tmp/bb/quotes-tag --model $M --max-prompt-chars 500 --max-len 192 --icl-k 2 --rank 8 --alpha 16 --common-lr 1e-3"
QA=$R/common-lora/adapter
QTRAIN="--model $M --bench /tmp/bb/quotes-tag --split train --dev-split dev --dev-users 35 --dev-every 50 --max-prompt-chars 500 --max-len 192 --common-lora $QA --simcse-steps 50 --steps 500 --users-per-step 4 --target-examples 2 --kl-weight 1 --lr 3e-4 --warmup 20 --out-rank 8 --out-alpha 16 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --context-tokens 512 --commit-every 10 --seed 0 --quiet"
t() { # t NAME CMD...: run alone, log, record wall/cpu/rss
  local name=$1; shift
  local l0=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -f "%e %U %S %M" -o /work/runs/logs/$name.time "$@" > /work/runs/logs/$name.log 2>&1
  local rc=$?
  read wall u s rss < /work/runs/logs/$name.time
  echo "$(date -u +%FT%TZ) $name rc=$rc wall=${wall}s cpu=$(echo "$u + $s" | bc)s rss=${rss}KB load_start=$l0 load_end=$(cut -d' ' -f1 /proc/loadavg) cpu_model=$(lscpu | sed -n 's/Model name: *//p')" >> /work/runs/times.txt
  return $rc
}
. /work/runs/env.sh
t quotes-common $H eval $Q --split dev --method common-lora --common-steps 1269 --out $R/dev --work-dir $R
t quotes-hyper-C $H hypertrain ${QTRAIN/--seed 0/--seed 1} --local-steps 200 --center --standardize --pool responses --context-query-chars 160 --keep-dev-checkpoints --out $R/hyper-C
echo q1 done >> /work/runs/times.txt
# after q1: dev-score the seed-1 checkpoints
. /work/runs/env.sh
while ! grep -q "q1 done" /work/runs/times.txt; do sleep 20; done
D="$Q --split dev --train-split none"
for s in 150 200 100; do
  t quotes-dev-hyper-C-s$s $H eval $D --method hypernet --hypernet $R/hyper-C/hypernet-step$s --out $R/dev-C/s$s
done
echo q2 done >> /work/runs/times.txt
# after q2: test-score the dev-best seed-1 checkpoint, then the per-user cost comparison in one run
. /work/runs/env.sh
while ! grep -q "q2 done" /work/runs/times.txt; do sleep 20; done
BEST=$(python3 - <<'PY'
import json,glob
best=None
for s in (100,150,200):
    f=glob.glob(f'/work/runs/eval/quotes-tag/dev-C/s{s}/*-T0.json')
    if not f: continue
    a=json.load(open(f[0]))['summary']['accuracy']
    if best is None or a>best[1]: best=(s,a)
print(best[0])
PY
)
echo "best dev step $BEST" >> /work/runs/times.txt
T="$Q --split test --train-split none --common-adapter $QA"
t quotes-test-hyper-C-s$BEST $H eval $T --temperature 0,1 --method hypernet --hypernet $R/hyper-C/hypernet-step$BEST --out $R/test-C/s$BEST
t cost-hypernet $H eval $T --users 8 --temperature 0 --method hypernet --hypernet $R/hyper-C/hypernet-step$BEST --out $R/cost
t cost-user-lora-f32 $H eval $T --users 8 --temperature 0 --method user-lora-f32 --user-epochs 1 --user-lr 3e-3 --out $R/cost
t cost-user-lora $H eval $T --users 8 --temperature 0 --method user-lora --user-epochs 1 --user-lr 3e-3 --out $R/cost
echo q3 done >> /work/runs/times.txt
. /work/runs/env.sh
while ! grep -q "q3 done" /work/runs/times.txt; do sleep 10; done
python3 -m venv /work/venv && /work/venv/bin/pip install -q numpy
/work/venv/bin/python /work/runs/tools/avg_ckpt.py $R/hyper-C/avg-100-200 $R/hyper-C/hypernet-step100 $R/hyper-C/hypernet-step150 $R/hyper-C/hypernet-step200
D="$Q --split dev --train-split none"
T="$Q --split test --train-split none --common-adapter $QA"
t quotes-dev-hyper-C-avg $H eval $D --method hypernet --hypernet $R/hyper-C/avg-100-200 --out $R/dev-C/avg
t quotes-test-hyper-C-s100 $H eval $T --temperature 0 --method hypernet --hypernet $R/hyper-C/hypernet-step100 --out $R/test-C/s100
t quotes-test-hyper-C-s200 $H eval $T --temperature 0 --method hypernet --hypernet $R/hyper-C/hypernet-step200 --out $R/test-C/s200
echo q4 done >> /work/runs/times.txt
. /work/runs/env.sh
t quotes-hyper-C-resume300 $H hypertrain ${QTRAIN/--seed 0/--seed 1} --resume --local-steps 100 --center --standardize --pool responses --context-query-chars 160 --keep-dev-checkpoints --out $R/hyper-C
D="$Q --split dev --train-split none"
for s in 250 300; do
  t quotes-dev-hyper-C-s$s $H eval $D --method hypernet --hypernet $R/hyper-C/hypernet-step$s --out $R/dev-C/s$s
done
T="$Q --split test --train-split none --common-adapter $QA"
for s in 250 300; do
  t quotes-test-hyper-C-s$s $H eval $T --temperature 0 --method hypernet --hypernet $R/hyper-C/hypernet-step$s --out $R/test-C/s$s
done
echo q5 done >> /work/runs/times.txt
