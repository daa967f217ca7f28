#!/usr/bin/env bash
# Runs failure_child under mpirun and checks that the job ends (no hang), with the status and messages expected.
#   run_failure_test.sh MODE CHILD MPIRUN ARGS...
set -u
mode="$1"; child="$2"; shift 2
start=$SECONDS
out="$(timeout 120 "$@" "$child" "$mode" 2>&1)"
status=$?
elapsed=$((SECONDS - start))
echo "$out"
echo "-- mode $mode: exit status $status after ${elapsed} s"
fail() { echo "FAILED: $*"; exit 1; }
[[ $status -ne 124 ]] || fail "the job hung (killed by timeout after 120 s)"
echo "$out" | grep -q "first all_reduce gave 2048" || fail "the first all_reduce did not sum over 2 ranks"
case "$mode" in
  hang_exit)
    [[ $status -ne 0 ]] || fail "the job ended with status 0; a timed-out rank must end it non-zero"
    echo "$out" | grep -q "rank 0: all_reduce #1 of 1024 float32 elements" || fail "no message naming rank 0 and all_reduce #1"
    echo "$out" | grep -q "did not finish within 1 s" || fail "the message does not give the timeout"
    [[ $elapsed -lt 40 ]] || fail "the job took ${elapsed} s to end"
    ;;
  hang_throw)
    echo "$out" | grep -q "rank 0 caught TimeoutError: .*all_reduce #1 .*did not finish within 1 s" ||
      fail "rank 0 did not catch a TimeoutError naming all_reduce #1"
    ;;
  kill)
    [[ $status -ne 0 ]] || fail "the job ended with status 0 although rank 1 was killed"
    [[ $elapsed -lt 60 ]] || fail "the job took ${elapsed} s to end"
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo "PASSED"
