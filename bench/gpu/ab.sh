#!/usr/bin/env bash
# Same-machine A/B of source changes in one device call (issue 8). From the
# repo root:
#   OUT=$OUT AB_PATCH="change.diff [other.diff ...]" \
#       AB_RUNS="tag|VAR=value ...|binary args;..." \
#       [AB_ROUNDS=2] [AB_TEST='Suite.*'] timeout 590 bash bench/gpu/ab.sh
# A is the tree as it is; B, C, ... the tree with each AB_PATCH file applied
# in turn (`git apply` to the working tree: a patch travels as a file of the
# tree, since the device copy has no git history to check an older commit
# out of). Builds A with session.sh's build step and keeps the binaries the
# runs name; then, for each patch, applies it, rebuilds those binaries
# (ninja: only what the patch touches), keeps them and takes the patch back
# out. AB_TEST (a gtest filter) runs gpu_tests of every variant, A too (a
# narrow filter keeps the call short; before a change lands, run the whole
# gpu_tests, session.sh's gputests step, ~3 minutes: session 37 found a
# bug two sessions' filters had missed). Each
# AB_RUNS entry runs AB_ROUNDS times (default 2), the variants alternating
# (A r1, B r1, [C r1,] A r2, B r2, ...), its environment set from the
# entry's VAR=value words, its output in $OUT/ab/<tag>_<variant>_r<n>.txt.
# Everything under $OUT/ab (the runs, the build and test logs) is packed
# into $OUT/ab.tgz and the folder removed: the device tool brings back only
# a few files. $OUT/ab.log holds the steps, their times and exit status.
# Binaries are copied out of the build folder, which works because the
# osprey libraries link statically. The objects a patch's rebuild made are
# deleted after it, so the next build of the folder compiles the tree as it
# is again. Every patch is checked to apply before
# anything is built.
# AB_BUILD_CMD / AB_REBUILD_CMD / AB_BUILD_DIR / AB_BIN_DIR replace the build
# of A, the rebuild of a patched variant (the binaries' names appended), the
# folder the binaries are found in and the one they are kept in (defaults:
# session.sh's build step, ninja -C build-gpu, build-gpu, /tmp/ab); CTest's
# bench_ab runs the script on a stand-in tree with them.
# Example (the prefill kernel's bench at 1k, 4k and 8k tokens):
#   AB_PATCH=bench/results/gpu/s27/prefill_persistent_experiment.diff \
#   AB_TEST='PrefillAttention.*' AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|gpu_tests \
#   --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*" ...
set -uo pipefail
t0=$(date +%s)
out=${OUT:-/tmp/ab-out}
dir=$out/ab
log=$out/ab.log
mkdir -p "$dir"
say() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - t0))s] $*" | tee -a "$log"; }
pack() {
  tar -czf "$out/ab.tgz" -C "$dir" . 2>/dev/null && rm -rf "$dir"
}
trap pack EXIT

read -r -a patches <<<"${AB_PATCH:?AB_PATCH: the changes to measure, diffs against this tree}"
runs=${AB_RUNS:?AB_RUNS: tag|VAR=value ...|binary args entries, ;-separated}
rounds=${AB_ROUNDS:-2}
letters=(B C D E F G H)
((${#patches[@]} >= 1 && ${#patches[@]} <= ${#letters[@]})) || { say "1 to ${#letters[@]} patches"; exit 2; }
for p in "${patches[@]}"; do
  [[ -f "$p" ]] || { say "no patch file $p"; exit 2; }
  git apply --check "$p" 2>>"$log" || { say "the patch $p does not apply to this tree"; exit 2; }
done
variants=(A "${letters[@]:0:${#patches[@]}}")

# The binaries the runs name (first word of each entry's third field).
IFS=';' read -r -a entries <<<"$runs"
bins=()
for e in "${entries[@]}"; do
  IFS='|' read -r _ _ cmd <<<"$e"
  read -r b _ <<<"$cmd"
  # shellcheck disable=SC2076  # a literal match: is $b in the list yet
  [[ -n "$b" && ! " ${bins[*]-} " =~ " $b " ]] && bins+=("$b")
done
# shellcheck disable=SC2076
[[ -n "${AB_TEST:-}" && ! " ${bins[*]-} " =~ " gpu_tests " ]] && bins+=(gpu_tests)

bdir=${AB_BUILD_DIR:-build-gpu}
if [[ -n "${AB_BUILD_CMD:-}" ]]; then
  bash -c "$AB_BUILD_CMD" >"$dir/build_A.log" 2>&1
else
  OUT=$dir STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1
fi
rc=$?
say "build A rc=$rc"
[[ $rc -eq 0 ]] || exit 1
if [[ -d /tmp/px ]]; then  # the PCRE2 / utf8proc packages session.sh unpacked (for a rebuild that reconfigures, too)
  export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
  export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
bins_at=${AB_BIN_DIR:-/tmp/ab}  # where the kept binaries go: $bins_at/<variant>
keep() {  # variant: copies the named binaries out of the build folder
  mkdir -p "$bins_at/$1"
  for b in "${bins[@]}"; do
    local f
    f=$(find "$bdir" -name "$b" -type f -perm -u+x | head -1)
    [[ -n "$f" ]] || { say "no $b binary in $bdir"; return 1; }
    cp "$f" "$bins_at/$1/$b"
  done
}
run_tests() {  # variant: its gpu_tests with the AB_TEST filter
  [[ -n "${AB_TEST:-}" ]] || return 0
  timeout 300 "$bins_at/$1/gpu_tests" --gtest_filter="$AB_TEST" >"$dir/test_$1.txt" 2>&1
  say "gpu_tests $1 ($AB_TEST) rc=$?"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$dir/test_$1.txt" | head -20 | tee -a "$log"
}
keep A || exit 1
run_tests A

for i in "${!patches[@]}"; do
  p=${patches[$i]}
  v=${letters[$i]}
  git apply "$p" || { say "git apply $p failed"; exit 1; }
  mark=$dir/.built_before_$v
  touch "$mark"
  if [[ -n "${AB_REBUILD_CMD:-}" ]]; then
    bash -c "$AB_REBUILD_CMD ${bins[*]}" >"$dir/build_$v.log" 2>&1
  else
    ninja -C "$bdir" "${bins[@]}" >"$dir/build_$v.log" 2>&1
  fi
  rc=$?
  git apply -R "$p" || { say "could not take $p back out"; exit 1; }
  # The objects built from the patched sources go: otherwise a later build
  # in this folder (the next device call on a warm machine, whose copy of
  # the tree keeps the sources' older times) would keep linking them
  # (the binaries are linked: keep copies them below).
  find "$bdir" -name '*.o' -newer "$mark" -delete
  say "build $v ($p) rc=$rc"
  [[ $rc -eq 0 ]] || { grep -E "error|FAILED" -A3 "$dir/build_$v.log" | head -30 | tee -a "$log"; exit 1; }
  keep "$v" || exit 1
  run_tests "$v"
done

set -f  # the runs' arguments are not file patterns (gtest filters)
for r in $(seq 1 "$rounds"); do
  for e in "${entries[@]}"; do
    IFS='|' read -r tag vars cmd <<<"$e"
    read -r b args <<<"$cmd"
    for v in "${variants[@]}"; do
      # shellcheck disable=SC2086  # vars and args split into words on purpose
      env $vars "$bins_at/$v/$b" $args >"$dir/${tag}_${v}_r$r.txt" 2>&1
      say "$tag $v r$r rc=$?"
    done
  done
done
