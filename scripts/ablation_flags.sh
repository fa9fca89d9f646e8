# Sourced by the GPU scripts: the 20m ablation's fixed settings,
# in one place so that every probe runs exactly the steps the results folders
# were trained with. Change them only together with new results folders
# (the runner refuses to --resume a folder whose run.json differs).
# --scan-blocks: every arm so far trained scanned (since 1f04657), and on the
# GPU host a scanned FP4 step compiles 2.5x faster, which a short arm's
# wall time feels more than the 1.2-1.4x slower steps (docs/notes/training.md).
ABLATION_FLAGS=(--model 20m --tokens 10485760 --batch-size 32 --seq-len 1024 --data bpe16384 --data-seed 0
                --eval-every 40 --eval-batches 8 --downstream all --downstream-limit 500 --keep-checkpoints 0
                --no-progress --scan-blocks)
