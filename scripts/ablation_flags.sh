# Sourced by the device scripts: the 20m ablation's fixed settings (issue 10),
# in one place so that every probe runs exactly the steps the results folders
# were trained with. Change them only together with new results folders
# (the runner refuses to --resume a folder whose run.json differs).
ABLATION_FLAGS=(--model 20m --tokens 10485760 --batch-size 32 --seq-len 1024 --data bpe16384 --data-seed 0
                --eval-every 40 --eval-batches 8 --downstream all --downstream-limit 500 --keep-checkpoints 0
                --no-progress)
