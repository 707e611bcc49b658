#!/usr/bin/env bash
# Rebuild everything derived from the sample model (run after scripts/train_sample_model.py):
# the demo run, the prefill profile, the drift report, the CAA quotes vector and its depth sweep.
# `--drift-only` stops after the drift report.
# Outputs land in sample_data/ (runs/, profiles/, vectors/, reports/); the README quotes the printed tables.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # the sample model is too small for intra-op threads to pay off
PY=${PY:-.venv/bin/python}
TS=(${PY} -m trajscope.cli)
mkdir -p sample_data/profiles sample_data/vectors sample_data/reports
if [[ "${1:-}" != "--drift-only" ]]; then ${PY} scripts/make_demo_run.py; fi
# the profile records its fit / calibrate / evaluate split (seed 0, by source file); drift evaluates on files it never saw
"${TS[@]}" profile --model sample --prompts sample_data/prompts/heldout_code.jsonl --fpr 0.01 --seed 0 \
    --out sample_data/profiles/trajscope-tiny.safetensors
rm -rf /tmp/trajscope-drift
"${TS[@]}" drift --model sample --prompts sample_data/prompts/heldout_code.jsonl \
    --profile sample_data/profiles/trajscope-tiny.safetensors --max-new-tokens 128 --no-eos \
    --trajectory-rate 0.1 --seed 0 --out /tmp/trajscope-drift | tee sample_data/reports/drift.txt
for t in by_position by_depth by_entropy gap heldout_fpr trajectory; do
    cp /tmp/trajscope-drift/drift_$t.parquet sample_data/reports/drift_$t.parquet
done
cp /tmp/trajscope-drift/drift.result.json sample_data/reports/  # the headline numbers (drift_positions stays out: 0.8 MB)
if [[ "${1:-}" == "--drift-only" ]]; then exit 0; fi
head -n 8 sample_data/prompts/heldout_code.jsonl > /tmp/trajscope-steer-prompts.jsonl
"${TS[@]}" steer-sweep --model sample --pairs sample_data/prompts/quotes_pairs.jsonl --layer 3 \
    --prompts /tmp/trajscope-steer-prompts.jsonl --depths 1,10,50,200 --strengths 0.5,1 --window 20 \
    --targets '"' ' "' '("' --out /tmp/trajscope-steer | tee sample_data/reports/steering.txt
cp /tmp/trajscope-steer/steering_summary.parquet /tmp/trajscope-steer/steering.parquet \
    /tmp/trajscope-steer/steering.result.json sample_data/reports/
cp /tmp/trajscope-steer/vector.safetensors sample_data/vectors/quotes_caa_layer3.safetensors
