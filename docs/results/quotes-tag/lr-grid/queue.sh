# 2026-12-04 late session (Intel Xeon, AMX), binary /work/bin/hexlora-f388956; env.sh as in docs/results/quotes-tag/hyper-seed1b/queue.sh.
# A finer dev grid for the per-user learning rate, then test at the dev pick (q5 waited for q4). Each run with bash.
## q4.sh
# quotes-tag: a finer dev grid for the per-user learning rate (2e-3 and 5e-3 between the tried 1e-3, 3e-3, 1e-2), 1 epoch, CPU f32
. /work/runs/env.sh
t quotes-common $H eval $Q --split dev --method common-lora --common-steps 1269 --out $R/dev --work-dir $R
md5sum $QA/* >> /work/runs/times.txt
D="$Q --split dev --train-split none --common-adapter $QA"
for lr in 2e-3 5e-3; do
  t quotes-dev-ulf32-lr$lr $H eval $D --method user-lora-f32 --user-epochs 1 --user-lr $lr --out $R/dev-ulf32-lr$lr
done
echo q4 done >> /work/runs/times.txt
## q5.sh
# quotes-tag test at the dev-chosen rate of the finer grid (waits for q4)
. /work/runs/env.sh
while ! grep -q "q4 done" /work/runs/times.txt; do sleep 10; done
lr=$(python3 - <<'PY'
import json
dev={'1e-3':58.82,'3e-3':61.18}   # committed dev runs (docs/results/quotes-tag/dev/ulf32-lr*-e1.json)
for lr in ('2e-3','5e-3'):
    d=json.load(open('/work/runs/eval/quotes-tag/dev-ulf32-lr%s/quotes-tag-user-lora-f32-dev-T0.json'%lr))
    dev[lr]=round(d['summary']['accuracy']*100,2)
print(max(dev,key=dev.get))
PY
)
echo "q5: dev-chosen lr $lr" >> /work/runs/times.txt
T="$Q --split test --train-split none --temperature 0 --common-adapter $QA"
t quotes-test-ulf32-lr$lr $H eval $T --method user-lora-f32 --user-epochs 1 --user-lr $lr --out $R/test-lr$lr
t quotes-test-ul-lr$lr $H eval $T --method user-lora --user-epochs 1 --user-lr $lr --out $R/test-lr$lr
echo q5 done >> /work/runs/times.txt
