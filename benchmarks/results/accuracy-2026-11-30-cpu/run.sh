#!/usr/bin/env bash
# SmolLM2 accuracy at 2K on CPU: calibrate, then each mode x budget on two tasks, 20 samples each.
cd /work/main
O=/tmp/acc
python -m pulseio_engine.cli calibrate --model smollm2 --out $O/heads_smollm2.json --prompts 8 --prompt-len 512 > $O/calibrate.log 2>&1
for task in niah-single variable-tracking; do
  python -m pulseio_engine.cli eval --model smollm2 --task $task --context-len 2048 --samples 20 --mode vanilla --token-budget 2048 --json $O/${task}_vanilla.json >> $O/eval.log 2>&1
  for budget in 512 1024; do
    for mode in quest solohead solohead-reversed; do
      python -m pulseio_engine.cli eval --model smollm2 --task $task --context-len 2048 --samples 20 --mode $mode --token-budget $budget --heads $O/heads_smollm2.json --json $O/${task}_${mode}_${budget}.json >> $O/eval.log 2>&1
    done
  done
done
echo done >> $O/eval.log
