# Sourced by the GPU scripts: each ablation's fixed settings and results folder,
# chosen by ABLATION_SET, in one place so that every probe runs exactly the steps
# its results folders were trained with. Change a set's flags only together with
# a new results folder (the runner refuses to --resume a folder whose run.json
# differs). Sets:
#   h200_20m    the first small ablation: 20m, 10.5M tokens per arm, data order 0 for every seed.
#   stage1_20m  the reproduction's stage 1: 20m, 300M tokens per arm (9,156 steps of 32,768 tokens, 1.75
#               passes over the train split), seed s with data order s; OsciReset and
#               OutControl at their defaults (the reference's values, scaled to the schedule).
#   stage2_70m  stage 2: the reference's 70M shape (8 layers, d 512), 600M tokens per arm
#               (18,311 steps, 3.5 passes over the train split), seed s with data order s.
# --scan-blocks: every arm of both sets trains scanned (since 1f04657). On the GPU host a
# scanned FP4 step compiles 2.5x faster; unrolled steps are 1.2-1.4x faster
# (docs/notes/training.md), a gain a 300M-token arm would feel, but one set keeps one model
# graph for all its arms and seeds.
ABLATION_SET="${ABLATION_SET:-h200_20m}"
# What the reproduction's stages share: 32 x 1024 tokens per step, all downstream tasks at the end.
STAGE_FLAGS=(--batch-size 32 --seq-len 1024 --data bpe16384 --downstream all --downstream-limit 500
             --checkpoint-every 500 --keep-checkpoints 0 --no-progress --scan-blocks --eval-batches 8)
case "$ABLATION_SET" in
  h200_20m)
    ABLATION_DIR=experiments/results/h200_20m
    ABLATION_DATA_SEED=fixed
    ABLATION_FLAGS=(--model 20m --tokens 10485760 --batch-size 32 --seq-len 1024 --data bpe16384 --data-seed 0
                    --eval-every 40 --eval-batches 8 --downstream all --downstream-limit 500 --keep-checkpoints 0
                    --no-progress --scan-blocks) ;;
  stage1_20m)
    ABLATION_DIR=experiments/results/stage1_20m
    ABLATION_DATA_SEED=seed
    ABLATION_FLAGS=(--model 20m --tokens 300023808 --eval-every 100 "${STAGE_FLAGS[@]}") ;;
  stage2_70m)
    ABLATION_DIR=experiments/results/stage2_70m
    ABLATION_DATA_SEED=seed
    ABLATION_FLAGS=(--model 70m --tokens 600014848 --eval-every 200 "${STAGE_FLAGS[@]}") ;;
  *)
    echo "unknown ABLATION_SET '$ABLATION_SET' (known: h200_20m, stage1_20m, stage2_70m)" >&2
    return 2 2>/dev/null || exit 2 ;;
esac
# The per-seed flags of a set: the seed, and the data order where it follows the seed.
seed_flags() {
  if [ "$ABLATION_DATA_SEED" = seed ]; then echo "--seed $1 --data-seed $1"; else echo "--seed $1"; fi
}
