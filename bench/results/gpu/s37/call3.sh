#!/usr/bin/env bash
# Session 37, call 3 (carry [".debs"]; timeout 580): main at ba8dc23 (the
# decode attention's trigger at its start, model_bench's CUPTI detach):
# target 1's figures and every GPU test.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS="build decode gputests" END_S=560 timeout 570 bash bench/gpu/session.sh > $o/console.txt 2>&1
echo "session rc=$?" >> $o/console.txt
grep -E "== |rc=|PASSED|FAILED|graph replay" $o/session.log | head -60
tar -czf $OUT/all.tgz -C $o . 2>/dev/null
