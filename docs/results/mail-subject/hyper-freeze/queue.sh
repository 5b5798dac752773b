# 2026-12-04 late session (Intel Xeon, AMX; the Zen 4 machine of the session before was shut down mid-run):
# mail-subject hypernetwork with --freeze-common added to the recipe of the 12-03 run (seed 0, same schedule),
# so the common part cannot drift; dev checkpoints, then test of the best on dev. q3.sh then q3b.sh, each run with bash.
# env.sh: as docs/results/quotes-tag/hyper-seed1b/queue.sh with H=/work/bin/hexlora-f388956 (release build of f388956).
# q3.sh's automatic pick of the best dev step failed (a path split at '-s' also split at '-subject'), so q3b.sh ran step 125 by hand.
## q3.sh
. /work/runs/env.sh
RM=/work/runs/eval/mail-subject
MS="--bench /tmp/bb/mail-subject --model $M --max-new-tokens 12 --max-prompt-chars 400 --max-len 160 --icl-k 2 --rank 8 --alpha 16 --common-lr 1e-3"
MA=$RM/common-lora/adapter
MTRAIN="--model $M --bench /tmp/bb/mail-subject --split train --dev-split dev --dev-users 23 --dev-every 25 --max-prompt-chars 400 --max-len 160 --common-lora $MA --simcse-steps 50 --steps 500 --users-per-step 4 --target-examples 2 --kl-weight 1 --lr 3e-4 --warmup 20 --out-rank 8 --out-alpha 16 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --context-tokens 512 --commit-every 10 --seed 0 --quiet"
t mail-common $H eval $MS --split dev --method common-lora --common-steps 967 --out $RM/dev --work-dir $RM
md5sum $MA/* >> /work/runs/times.txt
t mail-hyper-F $H hypertrain $MTRAIN --local-steps 150 --center --standardize --pool responses --context-query-chars 160 --keep-dev-checkpoints --freeze-common --out $RM/hyper-F
for s in 75 100 125 150; do
  t mail-dev-hyper-F-s$s $H eval $MS --split dev --train-split none --method hypernet --hypernet $RM/hyper-F/hypernet-step$s --out $RM/dev-hyper-F-s$s
done
best=$(python3 -c "
import json,glob
r=[(json.load(open(f))['summary']['rouge1'],int(f.split('-s')[-1].split('/')[0])) for s in (75,100,125,150) for f in glob.glob('$RM/dev-hyper-F-s%d/*T0.json'%s)]
print(max(r)[1])")
echo "q3 best dev step $best" >> /work/runs/times.txt
t mail-test-hyper-F-s$best $H eval $MS --split test --train-split none --temperature 0 --method hypernet --hypernet $RM/hyper-F/hypernet-step$best --out $RM/test-hyper-F
echo q3 done >> /work/runs/times.txt
## q3b.sh
. /work/runs/env.sh
RM=/work/runs/eval/mail-subject
MS="--bench /tmp/bb/mail-subject --model $M --max-new-tokens 12 --max-prompt-chars 400 --max-len 160 --icl-k 2 --rank 8 --alpha 16 --common-lr 1e-3"
echo "q3b: best dev step 125 (dev ROUGE-1 7.79/7.53/8.46/3.53 at steps 75/100/125/150; the automatic pick in q3.sh failed on a path split)" >> /work/runs/times.txt
t mail-test-hyper-F-s125 $H eval $MS --split test --train-split none --temperature 0 --method hypernet --hypernet $RM/hyper-F/hypernet-step125 --out $RM/test-hyper-F
echo q3b done >> /work/runs/times.txt
