#!/usr/bin/env bash
# Starts 2 ranks of launch_child by hand (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no MPI launcher) and checks
# that they met through the TCP rendezvous. Then a job whose rank 1 never starts must fail within its timeout.
#   run_tcp_test.sh CHILD
set -u
child="$1"
port=$(( 20000 + RANDOM % 20000 ))
# Variables of an MPI launcher that may surround this script would take precedence: clear them.
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS
common=(env WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)
fail() { echo "FAILED: $*"; exit 1; }
out0=$(mktemp); out1=$(mktemp)
trap 'rm -f "$out0" "$out1"' EXIT
timeout 60 "${common[@]}" RANK=0 LOCAL_RANK=0 "$child" >"$out0" 2>&1 & p0=$!
timeout 60 "${common[@]}" RANK=1 LOCAL_RANK=1 "$child" >"$out1" 2>&1 & p1=$!
wait $p0; s0=$?
wait $p1; s1=$?
cat "$out0" "$out1"
[[ $s0 -eq 0 && $s1 -eq 0 ]] || fail "exit status $s0 / $s1"
for f in "$out0" "$out1"; do
  grep -q "launcher torchrun, bootstrap tcp" "$f" || fail "a rank did not join through the TCP rendezvous"
  grep -qE "nccl all_reduce gave 3000|cpu all_reduce refused: .*start the job with mpirun" "$f" ||
    fail "a rank neither all-reduced through NCCL nor refused CPU collectives with the reason"
done
# Rank 1 never comes: rank 0 must give up within its timeout (KILN_DIST_TIMEOUT_S=2), naming the address.
start=$SECONDS
out=$(timeout 60 "${common[@]}" RANK=0 LOCAL_RANK=0 KILN_DIST_TIMEOUT_S=2 "$child" 2>&1); s=$?
echo "$out"
[[ $s -ne 0 && $s -ne 124 ]] || fail "rank 0 alone: exit status $s (expected a clear failure)"
echo "$out" | grep -q "127.0.0.1:$port" || fail "the error does not name MASTER_ADDR:MASTER_PORT"
(( SECONDS - start < 30 )) || fail "rank 0 alone took $((SECONDS - start)) s to give up"
echo PASSED
