#!/usr/bin/env bash
# One command for a GPU day (see benchmarks/gpu_validation.py): kernel profile, three traces replayed under two
# policies, predicted-vs-measured tables under --out (default docs/gpu-days/<date>-<gpu>-<model>, beside earlier
# days' results, to commit). Arguments pass through, e.g.
#   benchmarks/gpu_validation.sh                       # cuda, llama-3-8b
#   benchmarks/gpu_validation.sh --device cpu --small  # the CI path
set -euo pipefail
exec python "$(dirname "$0")/gpu_validation.py" "$@"
