#!/bin/sh
# Regenerates the figures in docs/img; run from the repository root: sh docs/img/make.sh
set -e
run="${PYTHON:-.venv/bin/python} -m stagewise"
for f in gpipe 1f1b interleaved-1f1b zb-h1 zb-v dualpipe-v; do
  $run draw "$f" -p 4 -m 8 --costs-per rank --memory -o "docs/img/$f-p4-m8.png"
  $run draw "$f" -p 8 -m 16 --costs-per rank -o "docs/img/$f-p8-m16.png"
done
$run compare -p 4 -m 8 --costs-per rank -o docs/img/compare-p4-m8.png > /dev/null
$run draw 1f1b -p 4 -m 8 -o docs/img/1f1b-p4-m8.txt
$run draw dualpipe -p 4 -m 8 --a2a 0.8 -o docs/img/dualpipe-a2a-p4-m8.png
PYTHONPATH=$PWD ${PYTHON:-.venv/bin/python} benchmarks/bench_moe_ratio.py -o docs/img/moe-a2a-ratio.png > /dev/null
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then  # the page itself, in headless Chromium
  PYTHONPATH=$PWD ${PYTHON:-.venv/bin/python} docs/img/workshop_shot.py '?schedules=zb-v,v-half,v-min&p=8&m=16&cap=5' \
    docs/img/workshop-memory.png
fi
echo "wrote docs/img"
