#!/usr/bin/env bash
# plot.sh : draw bench/plot.py's charts from compare.py CSVs, with matplotlib
# from PyPI in a virtual environment under .venv-plot (ignored by git; made on
# the first run). Arguments go to plot.py; by default the committed H200 charts:
#   bash bench/plot.sh                     # docs/img/ from the two H200 CSVs
#   bash bench/plot.sh --out /tmp/c bench/results/mine.csv
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-plot
if [ ! -x $venv/bin/python ] || ! $venv/bin/python -c "import matplotlib" 2>/dev/null; then
  python3 -m venv $venv
  $venv/bin/pip install --quiet matplotlib
fi
if [ $# -eq 0 ]; then
  set -- --out docs/img --dtypes bf16 bench/results/h200-fwd-sm90ws-run25.csv bench/results/h200-decode.csv
fi
exec $venv/bin/python bench/plot.py "$@"
