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
echo "wrote docs/img"
