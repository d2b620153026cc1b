#!/usr/bin/env bash
# The ablation table on a cluster: every configs/exp/ablation_*.yaml (and the baseline) x N seeds as one
# Slurm job array of RL runs (each task is slurm/ray_job.sbatch on its own allocation), then one job,
# after the whole array, that evaluates every run's final checkpoint per seed on a held-out dataset
# (--eval-data) and writes the table into OUT/table.md.
#
#   slurm/submit_ablations.sh --out runs/ablations --seeds 3 --eval-data runs/data/eval/native -- --nodes=16 --gpus-per-node=8 -- \
#       cluster=slurm_16x8 data.per_harness.hy_memory=... init_checkpoint=runs/opd/final reader_model.path=...
#
# Options before the first --: --out DIR (runs/ablations), --seeds N (3), --first-seed K (0: run.seed K..K+N-1,
# fresh seeds for a design read past the ones already run), --only "baseline no_traps",
# --base EXP (hy_memory_rl: each task runs its overlay itself), --sft-init DIR (the sft_init overlay's
# checkpoint when --base is another experiment), --eval-data DIR (required: the built held-out dataset
# the collecting job evaluates every arm on). Between the two --: sbatch options for every task.
# After the second --: Hydra overrides for every run. A task's own run directory is OUT/<ablation>/seed<k>.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${HYMEM_PYTHON:-.venv/bin/python}
OUT=runs/ablations SEEDS=3 FIRST=0 ONLY="" BASE=hy_memory_rl SFT="" EVAL=""
while (($#)) && [[ $1 != -- ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --first-seed) FIRST=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --sft-init) SFT=$2; shift 2 ;;
    --eval-data) EVAL=$2; shift 2 ;;
    *) echo "submit_ablations.sh: unknown option $1 (see the header)" >&2; exit 2 ;;
  esac
done
[[ -n $EVAL ]] || { echo "submit_ablations.sh: --eval-data DIR is required (see the header)" >&2; exit 2; }
[[ ${1:-} == -- ]] && shift
SBATCH_OPTS=()
while (($#)) && [[ $1 != -- ]]; do SBATCH_OPTS+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift

# shellcheck disable=SC2086  # --only is a list of names
N=$("$PY" scripts/ablations.py --plan-array --out "$OUT" --seeds "$SEEDS" --first-seed "$FIRST" --base "$BASE" \
  ${SFT:+--sft-init "$SFT"} ${ONLY:+--only $ONLY})
MANIFEST=$(realpath "$OUT/array_tasks.tsv")
# every task's config, checked before anything is queued (the check each task repeats on its allocation)
NODES=1 GPUS=0
for o in "${SBATCH_OPTS[@]}"; do
  case $o in
    --nodes=*) NODES=${o#*=} ;;
    --gpus-per-node=*) GPUS=${o##*[=:]} ;;
  esac
done
for ((i = 0; i < N; i++)); do
  IFS=$'\t' read -r -a TASK < <(sed -n "$((i + 1))p" "$MANIFEST")
  "$PY" -m hymem_train.launch check hymem_train.rl "$NODES" "$GPUS" "$@" "${TASK[@]:3}" >/dev/null
done
mkdir -p "$OUT/logs"
ARRAY=$(sbatch --parsable --array="0-$((N - 1))" --job-name=hymem-ablation --output="$OUT/logs/%x-%A_%a.out" \
  --export="ALL,HYMEM_ARRAY_MANIFEST=$MANIFEST" "${SBATCH_OPTS[@]}" slurm/ray_job.sbatch hymem_train.rl "$@")
ARRAY=${ARRAY%%;*}
COLLECT=$(sbatch --parsable --dependency="afterany:$ARRAY" --nodes=1 --ntasks=1 --job-name=hymem-ablation-table \
  --output="$OUT/logs/%x-%j.out" --wrap="$PY scripts/ablations.py --collect --out $OUT --eval-data $EVAL")
echo "array $ARRAY: $N runs ($(cut -f1 "$MANIFEST" | sort -u | tr '\n' ' ')x $SEEDS seeds) into $OUT"
echo "table job $COLLECT (after the array): $OUT/table.md"
