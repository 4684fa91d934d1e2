# ddp-train analyze end to end: flight records written by hand (two ranks inside collective #12,
# one that never issued it) give a verdict naming the collective and the rank that never came;
# --run picks an earlier job's records; a broken record or an empty folder is refused with exit 1
# naming the file or folder; on two ranks the command refuses to run.
source "$(dirname "$0")/lib.sh"

# record RANK COMPLETED ISSUED STEP [RUN] [WORLD]: a flight record of one rank whose ring holds
# collectives 10 to ISSUED (those up to COMPLETED completed), on stdout.
record() {
  local rank="$1" completed="$2" issued="$3" step="$4" run="${5:-job-b}" world="${6:-3}" seq
  local entries="" state ended
  for ((seq = 10; seq <= issued; ++seq)); do
    if ((seq <= completed)); then state=completed ended=1500.5; else state=started ended=null; fi
    entries+="${entries:+,}
    {\"seq\": $seq, \"what\": \"allreduce of 1234 floats\", \"bucket\": 1, \"bytes\": 4936,
     \"wire\": \"float32\", \"step\": $step, \"state\": \"$state\",
     \"enqueued\": 1500.0, \"started\": null, \"ended\": $ended}"
  done
  cat <<JSON
{"format": "ddp flight record", "version": 1, "run": "$run", "rank": $rank,
 "world_size": $world, "host": "node-$rank", "pid": $((4000 + rank)), "reason": "timeout",
 "written_at": $([[ "$run" == job-b ]] && echo 1600.0 || echo 1200.0), "step": $step,
 "issued": $issued, "completed": $completed, "capacity": 16, "entries": [$entries]}
JSON
}

dir="$WORK/run"
mkdir -p "$dir/flight"
record 0 11 12 3 >"$dir/flight/rank-0.json"
record 1 11 11 2 >"$dir/flight/rank-1.json"
record 2 11 12 3 >"$dir/flight/rank-2.json"
record 3 20 20 9 job-a 4 >"$dir/flight/rank-3.json"  # left by an earlier job of 4 ranks

out="$("$DDP_TRAIN" analyze "$dir" 2>&1)"
rc=$?
echo "$out"
check "analyze exits 0" test "$rc" = 0
check "it names the stuck collective and who never entered it" grep -qF "collective #12 \
(allreduce of 1234 floats, bucket 1, step 3) did not complete: ranks 0, 2 entered it, rank 1 \
never did." <<<"$out"
check "it says where rank 1 is" \
  grep -qF "rank 1 (node-1, pid 4001, record written on timeout) never issued #12" <<<"$out"
check "it says what rank 1 did last" grep -qF "  its last collective: #11 (allreduce of 1234 \
floats), completed, ended 99.5 s before the record" <<<"$out"
check "it says rank 1 is a step behind" \
  grep -qF "rank 1 is behind: still in step 2 while the others wait in step 3" <<<"$out"
check "it notes the earlier job's record" \
  grep -qF "note: ignored 1 record of an earlier run, job-a (rank-3.json)" <<<"$out"

out="$("$DDP_TRAIN" analyze "$dir" --run job-a 2>&1)"
check "--run job-a reads that job's record: ranks 0-2 left none" \
  grep -qF "ranks 0-2 left no flight record" <<<"$out"

printf '{"format": "ddp flight record", "version": 1,' >"$dir/flight/rank-2.json"
out="$("$DDP_TRAIN" analyze "$dir" 2>&1)"
rc=$?
check "a broken record: exit 1 ($rc)" test "$rc" = 1
check "a broken record: the error names the file" \
  grep -qF "ddp-train: error: $dir/flight/rank-2.json: not JSON" <<<"$out"

mkdir -p "$WORK/empty/flight"
out="$("$DDP_TRAIN" analyze "$WORK/empty" 2>&1)"
rc=$?
check "an empty folder: exit 1 ($rc)" test "$rc" = 1
check "an empty folder: the error names it" \
  grep -qF "ddp-train: error: $WORK/empty/flight: no flight record" <<<"$out"

expect_error "analyze on 2 ranks is refused" 2 "analyze runs in one process" analyze "$dir"
finish
