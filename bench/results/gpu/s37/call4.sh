#!/usr/bin/env bash
# Session 37, call 4 (carry [".debs"]; timeout 580): call 3 found
# PrefillAttention.MixedStepDecodesSplitOffMatchFloat64(F16) failing on
# main: since b7371b4 (session 35, the Q tile by TMA) the Q tensor map of a
# mixed step's prompt part spanned num_tokens rows while its token indices
# are absolute (from the leading decodes' count), so its last rows loaded
# as zeros. The fix (token_offset) and every GPU test again; target 1.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS="build gputests decode" END_S=560 timeout 570 bash bench/gpu/session.sh > $o/console.txt 2>&1
echo "session rc=$?" >> $o/console.txt
grep -E "== |rc=|PASSED|FAILED|graph replay" $o/session.log | head -60
tar -czf $OUT/all.tgz -C $o . 2>/dev/null
