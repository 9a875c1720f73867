#!/usr/bin/env bash
# Fuzzes gradcomp's parsers of untrusted bytes with libFuzzer (clang, ASan + UBSan):
#
#   bash scripts/fuzz.sh [--time SECONDS] [--merge] [HARNESS...]
#
# HARNESS: maxmin topk fp16 bf16 (the codecs' decoders and encoders), requests responses (the
# negotiation messages the controller parses), settings (the settings parser); all by default.
# Each runs for --time seconds (600 by default) from its committed corpus in
# test/fuzz/corpus/NAME, which stays untouched: new inputs go to build-fuzz/corpus/NAME, and
# crashes to build-fuzz/crashes/NAME/. --merge then minimizes the new inputs into the committed
# corpus (what ctest replays). Exits non-zero if any harness found a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

seconds=600
merge=0
harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds=${2:?--time needs seconds}; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
all=(maxmin topk fp16 bf16 requests responses settings)
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [[ " ${all[*]} " == *" $h "* ]] || { echo "fuzz.sh: no harness '$h' (${all[*]})" >&2; exit 2; }
done

bash scripts/install_deps.sh
if ! command -v clang++ >/dev/null || ! dpkg-query -W -f='${Status}' libclang-rt-dev 2>/dev/null | grep -q "ok installed"; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev
fi

dir=${GRADCOMP_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMP_FUZZ=ON \
  -DGRADCOMP_SANITIZE=address,undefined -DGRADCOMP_BUILD_BENCHMARKS=OFF -DGRADCOMP_WITH_CUDA=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${harnesses[@]}")

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=()
printf '%-10s %8s %10s %8s %s\n' harness seconds runs corpus result
for h in "${harnesses[@]}"; do
  work="$dir/corpus/$h"
  crashes="$dir/crashes/$h"
  mkdir -p "$work" "$crashes"
  log="$dir/fuzz-$h.log"
  set +e
  "$dir/test/fuzz/fuzz_$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=2048 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$work" "test/fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  size=$(ls "$work" | wc -l)
  if [ $rc -eq 0 ]; then
    result=clean
  else
    result="CRASH (exit $rc; $log, $crashes)"
    failed+=("$h")
  fi
  printf '%-10s %8s %10s %8s %s\n' "$h" "$seconds" "$runs" "$size" "$result"
  if [ $merge = 1 ] && [ $rc -eq 0 ]; then
    "$dir/test/fuzz/fuzz_$h" -merge=1 -use_counters=0 -max_len=2048 "test/fuzz/corpus/$h" "$work" >>"$log" 2>&1
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: crashes in ${failed[*]}; reproduce with $ROOT/$dir/test/fuzz/fuzz_NAME FILE" >&2
  exit 1
fi
