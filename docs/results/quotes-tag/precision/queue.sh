# The queue of 2026-12-04 evening (env: docs/results/quotes-tag/hyper-seed1b/queue.sh with H=/work/bin/hexlora-a65b579); the last item (test-ul, ~45 min) was dropped: it would not fit the session.
. /work/runs/env.sh
t bench-build $H bench build --out /tmp/bb
t quotes-common $H eval $Q --split dev --method common-lora --common-steps 1269 --out $R/dev --work-dir $R
md5sum $R/common-lora/adapter/* >> /work/runs/times.txt
D="$Q --split dev --train-split none --common-adapter $QA"
T="$Q --split test --train-split none --common-adapter $QA"
t dev-ulf32 $H eval $D --method user-lora-f32 --user-epochs 1 --user-lr 3e-3 --out $R/dev-ulf32 --work-dir $R/w-dev-ulf32
t test-ulf32 $H eval $T --method user-lora-f32 --user-epochs 1 --user-lr 3e-3 --out $R/test-ulf32 --work-dir $R/w-test-ulf32
t dev-ul $H eval $D --method user-lora --user-epochs 1 --user-lr 3e-3 --out $R/dev-ul --work-dir $R/w-dev-ul
t test-ul-f16 $H eval $T --method user-lora --precision f16 --user-epochs 1 --user-lr 3e-3 --out $R/test-ul-f16 --work-dir $R/w-test-ul-f16
t test-ul $H eval $T --method user-lora --user-epochs 1 --user-lr 3e-3 --out $R/test-ul --work-dir $R/w-test-ul
echo q1 done >> /work/runs/times.txt
# 2026-12-04 night session (same Zen 4, same binary and common LoRA): the dropped test-ul, alone.
t test-ul $H eval $T --method user-lora --user-epochs 1 --user-lr 3e-3 --out $R/test-ul --work-dir $R/w-test-ul
