# A rank that stops answering (here: SIGSTOP mid-training) must not hang the job: the others
# give up after distributed.timeout_s naming the collective and end with code 1 by themselves,
# and the launcher ends the stalled rank: the whole job is over within timeout_s + 10 s.
source "$(dirname "$0")/lib.sh"

stalled_rank_check "stalled rank" 3 "$WORK/out"
finish
