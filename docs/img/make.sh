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
  shot="env PYTHONPATH=$PWD ${PYTHON:-.venv/bin/python} docs/img/workshop_shot.py"
  $shot '?schedules=1f1b,zb-h1,zb-v&p=4&m=8' docs/img/workshop.png --hover '#timeline [data-k="2,1,12"]'
  $shot '?schedules=zb-v,v-half,v-min&p=8&m=16&cap=5' docs/img/workshop-memory.png
  $shot '?schedules=1f1b,zb-h1&p=4&m=8&mode=play&t=12.5' docs/img/workshop-play.png
  $shot '?p=4&m=8&mode=why&gap=0,0,4' docs/img/workshop-why.png
  # Build your own: 1F1B with 0B0 moved before 0F2 on rank 0, a wait cycle with rank 1
  $shot '?p=4&m=8&mode=build' docs/img/workshop-build.png --programs "$(printf '%s\n' \
    '0F0 0F1 0B0 0F2 0F3 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7' \
    '1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7' \
    '2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7' \
    '3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7')"
  $shot '?p=4&m=8&mode=teach' docs/img/workshop-teach.png --hover '#panel-teach [data-term="gaps:fill"]'
  # each mode at scale: p=16, m=64
  $shot '?schedules=zb-v,dualpipe-v&p=16&m=64' docs/img/workshop-view-p16-m64.png
  $shot '?p=16&m=64&mode=play&t=120' docs/img/workshop-play-p16-m64.png
  $shot '?p=16&m=64&mode=why&gap=0,15,0' docs/img/workshop-why-p16-m64.png
  $shot '?schedules=zb-v&p=16&m=64&mode=build' docs/img/workshop-build-p16-m64.png
  $shot '?p=16&m=64&mode=teach&lesson=bubble' docs/img/workshop-teach-p16-m64.png
fi
echo "wrote docs/img"
